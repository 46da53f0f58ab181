-- Reverts schema version 4.
DROP INDEX IF EXISTS {{schema}}.gendurable_instances_unique_key;
DROP INDEX IF EXISTS {{schema}}.gendurable_instances_partition_key;
