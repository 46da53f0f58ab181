-- Back to version 13's gendurable_pick, which counts only executing rows against a queue's
-- GlobalConcurrency: version 13's up migration, which only replaces that function's body, run
-- again; and the index of rows holding a lease while not executing goes.
DROP INDEX IF EXISTS {{schema}}.gendurable_instances_lingering_leases;
-- include: 013_pick_cursor.up.sql
