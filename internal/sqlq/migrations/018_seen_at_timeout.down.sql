-- Back to version 17: a step woken by its await's timeout forgets what the step that parked had
-- received. Version 17's gendurable_pick (its up migration run again: the function's body is
-- replaced; its column exists already) and version 10's gendurable_handoff (dropped, then its up
-- migration run again), then the column goes.
-- include: 017_unstarted_claims.up.sql
DROP FUNCTION IF EXISTS {{schema}}.gendurable_handoff(text[], text[], int[], bigint[], bigint[], bigint);
-- include: 010_key_handoff.up.sql
ALTER TABLE {{schema}}.gendurable_instances DROP COLUMN IF EXISTS inbox_seen;
