-- Reverts schema version 2.
DROP FUNCTION IF EXISTS {{schema}}.gendurable_inbox_sub(jsonb, jsonb);
DROP INDEX IF EXISTS {{schema}}.gendurable_signals_inbox;
CREATE INDEX gendurable_signals_inbox ON {{schema}}.gendurable_signals (target_id, name);
ALTER TABLE {{schema}}.gendurable_signals DROP COLUMN IF EXISTS consumed_at;
ALTER TABLE {{schema}}.gendurable_instances DROP COLUMN IF EXISTS inbox, DROP COLUMN IF EXISTS children_total,
  DROP COLUMN IF EXISTS fanout, DROP COLUMN IF EXISTS parent_fanout;
