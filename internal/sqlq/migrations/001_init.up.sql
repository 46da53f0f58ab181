-- gendurable schema version 1: instances, signals, and every index the hot path uses.
-- {{schema}} is replaced by the validated, quoted schema name.

CREATE TYPE {{schema}}.gendurable_status AS ENUM
  ('runnable', 'executing', 'awaiting_signal', 'awaiting_children', 'done', 'failed');

-- Every claim draws a fresh fencing token from this sequence.
CREATE SEQUENCE {{schema}}.gendurable_claim_token_seq AS bigint;
-- It starts at the clock in microseconds since 1970, not at 1: tokens must
-- keep growing across a reinstall (migrate down, then up). Every earlier token
-- was drawn at less than one a microsecond since its install (or since 1 before
-- this start), so it is smaller; a late outcome of a step claimed before the
-- reinstall then never matches a new claim of a new row with the same id, and a
-- resource that fences by token accepts the new runs. 2^53 (exact in JSON) is
-- centuries away.
SELECT setval('{{schema}}.gendurable_claim_token_seq',
              (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);

CREATE TABLE {{schema}}.gendurable_instances (
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  fsm              text NOT NULL,
  fsm_version      int  NOT NULL DEFAULT 1,
  queue            text NOT NULL DEFAULT 'default',
  step             text NOT NULL,
  state            jsonb NOT NULL DEFAULT '{}',
  result           jsonb,
  status           {{schema}}.gendurable_status NOT NULL DEFAULT 'runnable',
  priority         smallint NOT NULL DEFAULT 0,
  attempt          int NOT NULL DEFAULT 0,
  max_attempts     int NOT NULL DEFAULT 20,
  eligible_at      timestamptz NOT NULL DEFAULT now(),
  lease_expires_at timestamptz,
  claim_token      bigint,
  partition_key    text,
  unique_key       bytea,
  unique_scope     {{schema}}.gendurable_status[],
  unique_guard     bytea GENERATED ALWAYS AS
                     (CASE WHEN status = ANY (unique_scope) THEN unique_key END) STORED,
  awaits           text[],
  await_deadline   timestamptz,
  parent_id        bigint,
  children_pending int NOT NULL DEFAULT 0,
  errors           jsonb NOT NULL DEFAULT '[]',
  inserted_at      timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  finished_at      timestamptz,
  CONSTRAINT gendurable_instances_max_attempts_positive CHECK (max_attempts > 0),
  CONSTRAINT gendurable_instances_attempt_nonnegative CHECK (attempt >= 0)
);

-- pick: ordered by priority then eligibility, runnable rows only.
CREATE INDEX gendurable_instances_pick
  ON {{schema}}.gendurable_instances (queue, priority, eligible_at)
  WHERE status = 'runnable';

-- partition guard: keys currently executing.
CREATE INDEX gendurable_instances_partition_active
  ON {{schema}}.gendurable_instances (partition_key)
  WHERE status = 'executing' AND partition_key IS NOT NULL;

-- reap: executing rows by lease expiry.
CREATE INDEX gendurable_instances_lease
  ON {{schema}}.gendurable_instances (lease_expires_at)
  WHERE status = 'executing';

-- await timeouts: parked rows by deadline.
CREATE INDEX gendurable_instances_await_deadline
  ON {{schema}}.gendurable_instances (await_deadline)
  WHERE status = 'awaiting_signal' AND await_deadline IS NOT NULL;

-- unique insert: only rows whose status is inside their unique scope.
CREATE UNIQUE INDEX gendurable_instances_unique
  ON {{schema}}.gendurable_instances (unique_guard)
  WHERE unique_guard IS NOT NULL;

-- children of a parent.
CREATE INDEX gendurable_instances_parent
  ON {{schema}}.gendurable_instances (parent_id)
  WHERE parent_id IS NOT NULL;

CREATE TABLE {{schema}}.gendurable_signals (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  target_id   bigint NOT NULL,
  name        text NOT NULL,
  payload     jsonb,
  dedup_key   text,
  inserted_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (target_id, dedup_key)
);

-- inbox: signals of one instance, by name.
CREATE INDEX gendurable_signals_inbox
  ON {{schema}}.gendurable_signals (target_id, name);
