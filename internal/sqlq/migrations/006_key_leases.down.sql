-- Back to version 5: partition keys on session advisory locks again.
DROP FUNCTION {{schema}}.gendurable_pick(text, int, bigint, text, text[], int[], double precision[], int[], int, int);
DROP TABLE {{schema}}.gendurable_key_buckets;

CREATE INDEX IF NOT EXISTS gendurable_instances_partition_active
  ON {{schema}}.gendurable_instances (partition_key)
  WHERE status = 'executing' AND partition_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS gendurable_instances_pick
  ON {{schema}}.gendurable_instances (queue, priority, eligible_at)
  WHERE status = 'runnable';
DROP INDEX IF EXISTS {{schema}}.gendurable_instances_key_holders;
DROP INDEX IF EXISTS {{schema}}.gendurable_instances_pick_keyed;
DROP INDEX IF EXISTS {{schema}}.gendurable_instances_pick_plain;

ALTER TABLE {{schema}}.gendurable_instances DROP COLUMN key_limit;
