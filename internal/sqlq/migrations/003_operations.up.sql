-- gendurable schema version 3: what operators steer.

-- Paused queues are not picked by any process.
CREATE TABLE {{schema}}.gendurable_queues (
  name       text PRIMARY KEY,
  paused     boolean NOT NULL DEFAULT false,
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- prune: terminal rows by finish time. It blocks writes while it builds: on a large
-- table, create it CONCURRENTLY by hand first, with this name and definition.
CREATE INDEX IF NOT EXISTS gendurable_instances_finished
  ON {{schema}}.gendurable_instances (finished_at)
  WHERE status IN ('done', 'failed');
