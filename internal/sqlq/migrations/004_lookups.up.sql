-- gendurable schema version 4: operator lookups by key without scanning the table.
-- Search (Engine.List's Search, the dashboard's search box, `gendurable list
-- --search`) finds an instance by exact partition key or unique key in any
-- status; the indexes of version 1 cover only executing keys and in-scope
-- unique keys. Both columns are set at insert and never change, so these
-- indexes cost one entry per keyed insert and keep updates HOT-eligible.
-- (CREATE INDEX blocks writes while it builds: on a large table, create them
-- CONCURRENTLY by hand first, with these names, and this migration is a no-op.)

CREATE INDEX IF NOT EXISTS gendurable_instances_partition_key
  ON {{schema}}.gendurable_instances (partition_key, id)
  WHERE partition_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS gendurable_instances_unique_key
  ON {{schema}}.gendurable_instances (unique_key, id)
  WHERE unique_key IS NOT NULL;
