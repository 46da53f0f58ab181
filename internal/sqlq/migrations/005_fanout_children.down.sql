-- Reverts schema version 5.
CREATE INDEX IF NOT EXISTS gendurable_instances_parent
  ON {{schema}}.gendurable_instances (parent_id)
  WHERE parent_id IS NOT NULL;
DROP INDEX IF EXISTS {{schema}}.gendurable_instances_parent_fanout;
