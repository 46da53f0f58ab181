-- Back to version 16: the reaper charges every expired claim an attempt again; version 16's
-- gendurable_pick (its up migration run again: the function's body is replaced), then the column
-- goes.
-- include: 016_one_plain_statement.up.sql
ALTER TABLE {{schema}}.gendurable_instances DROP COLUMN IF EXISTS unstarted_token;
