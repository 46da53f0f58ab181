-- Reverts schema version 3.
DROP INDEX IF EXISTS {{schema}}.gendurable_instances_finished;
DROP TABLE IF EXISTS {{schema}}.gendurable_queues;
