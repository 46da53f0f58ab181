-- gendurable schema version 2: what signals, awaits and children need.

-- inbox: per instance, the count of unconsumed signals by name. Signal and
-- the await outcome both update the instance row, so they serialize on its
-- lock, and the await decides from this column (read from the row version
-- it locked) rather than from a snapshot of the signals table: no lost
-- wake-up under READ COMMITTED.
ALTER TABLE {{schema}}.gendurable_instances
  ADD COLUMN inbox jsonb NOT NULL DEFAULT '{}',
  -- children scheduled by the parent's last ScheduleChildren outcome.
  ADD COLUMN children_total int NOT NULL DEFAULT 0,
  -- fan-out generation: a parent counts its ScheduleChildren outcomes, each
  -- child records the generation it belongs to, and only children of the
  -- current generation count towards the fan-in.
  ADD COLUMN fanout int NOT NULL DEFAULT 0,
  ADD COLUMN parent_fanout int;

-- Consumed signals are kept (marked) until their instance is pruned, so a
-- dedup key stays a no-op for the instance's whole life.
ALTER TABLE {{schema}}.gendurable_signals ADD COLUMN consumed_at timestamptz;

DROP INDEX {{schema}}.gendurable_signals_inbox;
CREATE INDEX gendurable_signals_inbox
  ON {{schema}}.gendurable_signals (target_id, name)
  WHERE consumed_at IS NULL;

-- inbox minus consumed counts, dropping names that reach zero.
CREATE FUNCTION {{schema}}.gendurable_inbox_sub(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN b IS NULL THEN a ELSE coalesce(
    (SELECT jsonb_object_agg(e.key, e.n)
     FROM (SELECT key, value::int - coalesce((b ->> key)::int, 0) AS n FROM jsonb_each_text(a)) AS e
     WHERE e.n > 0),
    '{}'::jsonb) END
$$;
