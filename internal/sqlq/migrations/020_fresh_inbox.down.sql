-- Back to version 19: a claim that raced a signal hands its step the inbox of its own snapshot.
DROP FUNCTION IF EXISTS {{schema}}.gendurable_inbox_fresh(bigint, bigint[]);
