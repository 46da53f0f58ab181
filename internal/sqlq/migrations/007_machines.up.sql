-- gendurable schema version 7: machine definitions (docs/design.md §9). Every engine
-- writes the definitions of the machines it registers when it starts (one upsert),
-- and merges the transitions its steps took into them now and then (one statement
-- per flush, never one per step), so that a process that registers nothing — the
-- CLI, a standalone dashboard — draws every machine whole.
CREATE TABLE {{schema}}.gendurable_machines (
  name          text NOT NULL,
  version       int  NOT NULL,
  start_step    text NOT NULL,
  -- the step names, Start first, then the machine's Flow order, then by name
  steps         jsonb NOT NULL,
  -- declared transitions, [{"step", "to": [...], "kinds": [...]}]; NULL: none declared
  flow          jsonb,
  -- transitions taken, [{"from", "to", "outcome", "count"}], merged from every process
  observed      jsonb NOT NULL DEFAULT '[]',
  registered_at timestamptz NOT NULL DEFAULT now(), -- first registered
  updated_at    timestamptz NOT NULL DEFAULT now(), -- definition last changed
  seen_at       timestamptz NOT NULL DEFAULT now(), -- last start of an engine that registers it
  observed_at   timestamptz,                        -- observed last merged
  PRIMARY KEY (name, version),
  CONSTRAINT gendurable_machines_steps_array CHECK (jsonb_typeof(steps) = 'array'),
  CONSTRAINT gendurable_machines_flow_array CHECK (flow IS NULL OR jsonb_typeof(flow) = 'array'),
  CONSTRAINT gendurable_machines_observed_array CHECK (jsonb_typeof(observed) = 'array')
);
