-- gendurable schema version 6: partition keys become key leases in the database
-- (docs/design.md §6). A keyed row holds a slot of its key while it is executing
-- with a live lease: the executing row itself is the slot, stamped with the claim's
-- fencing token and lease, freed by its outcome or by its lease running out on the
-- database clock. The pick takes slots key by key, serialized per key by a
-- transaction-level advisory lock — no session state, nothing pinned between
-- statements, so it works behind a transaction-pooling proxy.
--
-- Rows claimed by engines of the previous version keep their guarantee across the
-- upgrade: they are executing rows of their key with a live lease, and the new pick
-- counts them like its own.

-- key_limit: the most rows of this row's key that may run at once (per-insert
-- InsertOpts.KeyLimit); NULL: the engine's KeyPolicy for the key, else 1.
ALTER TABLE {{schema}}.gendurable_instances
  ADD COLUMN key_limit int CONSTRAINT gendurable_instances_key_limit_positive CHECK (key_limit > 0);

-- Plain rows and keyed rows are picked by different index paths, so a hot key's
-- backlog never lies in the way of the plain pick's LIMIT, nor of another key's.
DROP INDEX {{schema}}.gendurable_instances_pick;
CREATE INDEX gendurable_instances_pick
  ON {{schema}}.gendurable_instances (queue, priority, eligible_at)
  WHERE status = 'runnable' AND partition_key IS NULL;
CREATE INDEX gendurable_instances_pick_keyed
  ON {{schema}}.gendurable_instances (queue, partition_key, priority, eligible_at)
  WHERE status = 'runnable' AND partition_key IS NOT NULL;

-- A key's holders: its executing rows, by lease.
DROP INDEX {{schema}}.gendurable_instances_partition_active;
CREATE INDEX gendurable_instances_key_holders
  ON {{schema}}.gendurable_instances (partition_key, lease_expires_at)
  WHERE status = 'executing' AND partition_key IS NOT NULL;

-- A rated key's token bucket (KeyPolicy.Rate): tokens left as of refilled_at.
-- Written only by the pick, under the key's lock.
CREATE TABLE {{schema}}.gendurable_key_buckets (
  key         text PRIMARY KEY,
  tokens      double precision NOT NULL,
  refilled_at timestamptz NOT NULL
);

-- gendurable_pick claims up to p_limit runnable rows of p_queue with a lease of
-- p_lease_us microseconds, and returns them (c), then one last row with c NULL
-- whose next_cursor is where the next pick's walk over keys starts, and which
-- counts the keys it found full (keys_full) or out of starts (keys_rated), by
-- policy: element i+1 for p_prefixes[i], element 1 for keys no policy matches.
--
-- Keyed rows are taken key by key, round robin: the walk starts after p_cursor
-- (the key the previous pick stopped at), goes up the keys that have runnable rows
-- in this queue and wraps around once, visiting at most p_max_keys keys, so one
-- key's backlog cannot starve another key and the cost is bounded by the batch,
-- not by the backlog. For each key: a transaction-level advisory lock (skip the
-- key if another pick holds it), then — in a fresh snapshot, which sees every claim
-- committed before the lock was granted — its live holders are counted against its
-- limit (the head row's key_limit, else the longest of p_prefixes it starts with,
-- else 1), and up to that many of its rows are claimed in (priority, eligible_at)
-- order — and no more than its token bucket holds, if that policy has a rate
-- (p_rates: starts per second, 0 for none; p_bursts: the bucket's size). Keyed
-- rows get up to half the batch first when plain rows wait too; plain rows get
-- the rest, in (priority, eligible_at) order; keyed rows fill what is left.
--
-- p_global > 0 bounds the queue's running steps across every process
-- (QueueConfig.GlobalConcurrency): under a transaction-level lock of the queue,
-- its executing rows with a live lease are counted and the batch shrinks to
-- what is left. That count reads the live leases of every queue (the lease
-- index), so it costs O(executing rows) — paid only by queues that set it.
CREATE FUNCTION {{schema}}.gendurable_pick(
  p_queue text, p_limit int, p_lease_us bigint, p_cursor text,
  p_prefixes text[], p_limits int[], p_rates double precision[], p_bursts int[], p_max_keys int,
  p_global int)
RETURNS TABLE (next_cursor text, keys_full int[], keys_rated int[], c {{schema}}.gendurable_instances)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  got      int := 0;
  n        int;
  budget   int;
  k        text;
  cur      text := coalesce(p_cursor, '');
  wrapped  boolean := coalesce(p_cursor, '') = '';
  visited  int := 0;
  lim      int;
  held     int;
  pol_lim  int;
  rate     double precision;
  burst    int;
  avail    double precision;
  pol      int;
  n_full   int[] := array_fill(0, ARRAY[coalesce(array_length(p_prefixes, 1), 0) + 1]);
  n_rated  int[] := array_fill(0, ARRAY[coalesce(array_length(p_prefixes, 1), 0) + 1]);
  total    int := p_limit;
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.gendurable_queues AS qp WHERE qp.name = p_queue AND qp.paused) THEN
    RETURN;
  END IF;
  IF p_global > 0 THEN
    PERFORM pg_advisory_xact_lock(hashtext('gendurable:{{schema}}'), hashtext('queue:' || p_queue));
    SELECT count(*) INTO held FROM {{schema}}.gendurable_instances AS h
    WHERE h.status = 'executing' AND h.lease_expires_at > now() AND h.queue = p_queue;
    total := least(p_limit, greatest(0, p_global - held));
  END IF;
  FOR phase IN 1..2 LOOP
    IF total <= 0 THEN
      EXIT;
    ELSIF phase = 1 THEN
      budget := greatest(1, total / 2);
    ELSE
      budget := total;
      -- plain rows, in (priority, eligible_at) order
      RETURN QUERY
        WITH claimed AS (
          UPDATE {{schema}}.gendurable_instances AS i
          SET status = 'executing',
              lease_expires_at = now() + p_lease_us * interval '1 microsecond',
              claim_token = nextval('{{schema}}.gendurable_claim_token_seq'),
              updated_at = now()
          FROM (SELECT x.id FROM {{schema}}.gendurable_instances AS x
                WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key IS NULL
                  AND x.eligible_at <= now()
                ORDER BY x.priority, x.eligible_at
                LIMIT total - got
                FOR UPDATE SKIP LOCKED) AS r
          WHERE i.id = r.id
          RETURNING i.*)
        SELECT NULL::text, NULL::int[], NULL::int[], claimed::{{schema}}.gendurable_instances FROM claimed;
      GET DIAGNOSTICS n = ROW_COUNT;
      got := got + n;
    END IF;
    -- keyed rows, key by key
    WHILE got < budget AND visited < p_max_keys LOOP
      SELECT x.partition_key INTO k FROM {{schema}}.gendurable_instances AS x
      WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key IS NOT NULL
        AND x.partition_key > cur
      ORDER BY x.partition_key
      LIMIT 1;
      IF k IS NULL OR (wrapped AND k > p_cursor AND coalesce(p_cursor, '') <> '') THEN
        EXIT WHEN wrapped;
        wrapped := true;
        cur := '';
        k := NULL;
        CONTINUE;
      END IF;
      cur := k;
      k := NULL;
      visited := visited + 1;
      CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtext('gendurable:{{schema}}'), hashtext(cur));
      SELECT p.l, p.rate, p.burst, p.ord INTO pol_lim, rate, burst, pol
      FROM unnest(p_prefixes, p_limits, p_rates, p_bursts) WITH ORDINALITY AS p(prefix, l, rate, burst, ord)
      WHERE starts_with(cur, p.prefix) ORDER BY length(p.prefix) DESC LIMIT 1;
      pol := coalesce(pol, 0) + 1;
      SELECT coalesce(x.key_limit, pol_lim, 1) INTO lim
      FROM {{schema}}.gendurable_instances AS x
      WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key = cur AND x.eligible_at <= now()
      ORDER BY x.priority, x.eligible_at
      LIMIT 1;
      CONTINUE WHEN lim IS NULL; -- nothing of this key is eligible yet
      SELECT count(*) INTO held FROM {{schema}}.gendurable_instances AS h
      WHERE h.status = 'executing' AND h.partition_key = cur AND h.lease_expires_at > now();
      IF held >= lim THEN
        n_full[pol] := n_full[pol] + 1;
      END IF;
      n := least(lim - held, budget - got);
      lim := NULL;
      IF n > 0 AND rate > 0 THEN
        INSERT INTO {{schema}}.gendurable_key_buckets AS b (key, tokens, refilled_at)
        VALUES (cur, burst, now()) ON CONFLICT (key) DO NOTHING;
        SELECT least(burst, b.tokens + extract(epoch FROM now() - b.refilled_at) * rate) INTO avail
        FROM {{schema}}.gendurable_key_buckets AS b WHERE b.key = cur;
        IF avail < 1 THEN
          n_rated[pol] := n_rated[pol] + 1;
        END IF;
        n := least(n, floor(avail)::int);
      END IF;
      CONTINUE WHEN n <= 0;
      RETURN QUERY
        WITH claimed AS (
          UPDATE {{schema}}.gendurable_instances AS i
          SET status = 'executing',
              lease_expires_at = now() + p_lease_us * interval '1 microsecond',
              claim_token = nextval('{{schema}}.gendurable_claim_token_seq'),
              updated_at = now()
          FROM (SELECT x.id FROM {{schema}}.gendurable_instances AS x
                WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key = cur
                  AND x.eligible_at <= now()
                ORDER BY x.priority, x.eligible_at
                LIMIT n
                FOR UPDATE SKIP LOCKED) AS r
          WHERE i.id = r.id
          RETURNING i.*)
        SELECT NULL::text, NULL::int[], NULL::int[], claimed::{{schema}}.gendurable_instances FROM claimed;
      GET DIAGNOSTICS n = ROW_COUNT;
      got := got + n;
      IF rate > 0 THEN
        UPDATE {{schema}}.gendurable_key_buckets SET tokens = avail - n, refilled_at = now() WHERE key = cur;
      END IF;
    END LOOP;
  END LOOP;
  next_cursor := cur;
  keys_full := n_full;
  keys_rated := n_rated;
  c := NULL;
  RETURN NEXT;
END
$$;
