-- Back to version 16: the reaper charges every expired claim an attempt again.
ALTER TABLE {{schema}}.gendurable_instances DROP COLUMN IF EXISTS unstarted_token;
