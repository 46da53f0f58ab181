-- gendurable schema version 5: a parent's children looked up by fan-out generation.
-- The claim of a parent after a fan-out (pick, childRowsSQL) reads the children of
-- its latest fan-out: parent_id = $1 AND parent_fanout = $2. The index of version 1
-- holds parent_id only, so that read went through the children of every earlier
-- fan-out and filtered them out: its cost grew with the parent's history, not with
-- what the step reads. This index finds one generation directly, and still serves
-- lookups by parent_id alone (Describe's children of every fan-out) as its leading
-- column. (CREATE INDEX blocks writes while it builds: on a large table, create it
-- CONCURRENTLY by hand first, with this name, and this migration only drops the old one.)

CREATE INDEX IF NOT EXISTS gendurable_instances_parent_fanout
  ON {{schema}}.gendurable_instances (parent_id, parent_fanout)
  WHERE parent_id IS NOT NULL;

DROP INDEX IF EXISTS {{schema}}.gendurable_instances_parent;
