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
  held     int;
  chunk    int;
  e        int;
  cur      text := coalesce(p_cursor, '');
  prev     text;
  acc      int;
  start    text := coalesce(p_cursor, '');  -- where this walk began
  wrapped  boolean := coalesce(p_cursor, '') = '';
  walked   boolean := false;                -- every key was visited once
  past     boolean;
  visited  int := 0;
  ks       text[];
  locked   text[];
  rk       text[];
  rtake    int[];
  ravail   double precision[];
  rfull    int[];
  rrated   int[];
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
    -- keyed rows, a chunk of keys at a time
    WHILE got < budget AND visited < p_max_keys AND NOT walked LOOP
      chunk := least(p_max_keys - visited, greatest(16, 2 * (budget - got)));
      -- The next keys with runnable rows after cur, in order: a loose scan of
      -- the keyed pick index, one probe per key. Past the wrap, only keys up
      -- to the cursor the walk started from.
      WITH RECURSIVE w(k, i) AS (
        (SELECT x.partition_key, 1 FROM {{schema}}.gendurable_instances AS x
         WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key IS NOT NULL
           AND x.partition_key > cur
         ORDER BY x.partition_key LIMIT 1)
        UNION ALL
        SELECT (SELECT x.partition_key FROM {{schema}}.gendurable_instances AS x
                WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key IS NOT NULL
                  AND x.partition_key > w.k
                ORDER BY x.partition_key LIMIT 1), w.i + 1
        FROM w WHERE w.k IS NOT NULL AND w.i < chunk)
      SELECT array_agg(w.k ORDER BY w.i) FILTER (WHERE NOT (wrapped AND start <> '' AND w.k > start)),
             bool_or(wrapped AND start <> '' AND w.k > start)
        INTO ks, past
      FROM w WHERE w.k IS NOT NULL;
      IF ks IS NULL THEN
        IF wrapped OR past THEN
          walked := true;
          EXIT;
        END IF;
        wrapped := true;
        cur := '';
        CONTINUE;
      END IF;
      walked := coalesce(past, false);
      visited := visited + cardinality(ks);
      prev := cur;
      cur := ks[cardinality(ks)];
      -- The keys no other pick is claiming now. Locks first, then (the next
      -- statements) a snapshot that sees every claim committed before them.
      SELECT array_agg(u.k ORDER BY u.ord) INTO locked
      FROM unnest(ks) WITH ORDINALITY AS u(k, ord)
      WHERE pg_try_advisory_xact_lock(hashtext('gendurable:{{schema}}'), hashtext(u.k));
      CONTINUE WHEN locked IS NULL;
      -- Each key's room: limit − live holders, and a rated key's tokens;
      -- keys with nothing eligible yet drop out.
      SELECT array_agg(r.k ORDER BY r.ord), array_agg(r.take ORDER BY r.ord),
             array_agg(r.avail ORDER BY r.ord), array_agg(r.full_pol) FILTER (WHERE r.full_pol IS NOT NULL),
             array_agg(r.rated_pol) FILTER (WHERE r.rated_pol IS NOT NULL)
        INTO rk, rtake, ravail, rfull, rrated
      FROM (
        SELECT q.k, q.ord, q.avail,
               CASE WHEN q.free <= 0 THEN q.pol END AS full_pol,
               CASE WHEN q.free > 0 AND q.avail < 1 THEN q.pol END AS rated_pol,
               greatest(0, least(q.free, coalesce(floor(q.avail)::int, q.free))) AS take
        FROM (
          SELECT u.k, u.ord, coalesce(p.ord, 0) + 1 AS pol,
                 coalesce(head.key_limit, p.l, 1) - held.n AS free,
                 CASE WHEN p.rate > 0 THEN
                   least(p.burst, coalesce(b.tokens + extract(epoch FROM now() - b.refilled_at) * p.rate, p.burst))
                 END AS avail
          FROM unnest(locked) WITH ORDINALITY AS u(k, ord)
          CROSS JOIN LATERAL (
            SELECT x.key_limit FROM {{schema}}.gendurable_instances AS x
            WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key = u.k AND x.eligible_at <= now()
            ORDER BY x.priority, x.eligible_at LIMIT 1) AS head
          CROSS JOIN LATERAL (
            SELECT count(*)::int AS n FROM {{schema}}.gendurable_instances AS h
            WHERE h.status = 'executing' AND h.partition_key = u.k AND h.lease_expires_at > now()) AS held
          LEFT JOIN LATERAL (
            SELECT pp.l, pp.rate, pp.burst, pp.ord
            FROM unnest(p_prefixes, p_limits, p_rates, p_bursts) WITH ORDINALITY AS pp(prefix, l, rate, burst, ord)
            WHERE starts_with(u.k, pp.prefix) ORDER BY length(pp.prefix) DESC LIMIT 1) AS p ON true
          LEFT JOIN LATERAL (
            SELECT bb.tokens, bb.refilled_at FROM {{schema}}.gendurable_key_buckets AS bb
            WHERE bb.key = u.k AND p.rate > 0
            OFFSET 0) AS b ON true -- one primary-key probe per rated key
        ) AS q
      ) AS r;
      FOR e IN 1..coalesce(cardinality(rfull), 0) LOOP
        n_full[rfull[e]] := n_full[rfull[e]] + 1;
      END LOOP;
      FOR e IN 1..coalesce(cardinality(rrated), 0) LOOP
        n_rated[rrated[e]] := n_rated[rrated[e]] + 1;
      END LOOP;
      CONTINUE WHEN rk IS NULL;
      -- A key left with nothing because the batch ran out before it gets its
      -- turn first in the next pick: the cursor stops before it. (A key that
      -- got part of what it could take has had its turn.)
      acc := 0;
      FOR e IN 1..cardinality(rk) LOOP
        IF rtake[e] > 0 AND acc >= budget - got THEN
          cur := coalesce((SELECT max(u.k) FROM unnest(ks) AS u(k) WHERE u.k < rk[e]), prev);
          walked := false;
          EXIT;
        END IF;
        acc := acc + rtake[e];
      END LOOP;
      -- Claim each key's rows, in walk order, within what is left of the
      -- budget; spend the rated keys' tokens.
      RETURN QUERY
        WITH t AS (
          SELECT u.k, u.take, u.avail,
                 least(u.take, greatest(0, (budget - got) - coalesce(sum(u.take) OVER (
                   ORDER BY u.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0))) AS n
          FROM unnest(rk, rtake, ravail) WITH ORDINALITY AS u(k, take, avail, ord)
        ), claimed AS (
          UPDATE {{schema}}.gendurable_instances AS i
          SET status = 'executing',
              lease_expires_at = now() + p_lease_us * interval '1 microsecond',
              claim_token = nextval('{{schema}}.gendurable_claim_token_seq'),
              updated_at = now()
          FROM (SELECT x.id FROM t CROSS JOIN LATERAL (
                  SELECT x.id FROM {{schema}}.gendurable_instances AS x
                  WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key = t.k
                    AND x.eligible_at <= now()
                  ORDER BY x.priority, x.eligible_at
                  LIMIT t.n
                  FOR UPDATE SKIP LOCKED) AS x
                WHERE t.n > 0) AS r
          WHERE i.id = r.id
          RETURNING i.*
        ), spent AS (
          INSERT INTO {{schema}}.gendurable_key_buckets AS b (key, tokens, refilled_at)
          SELECT t.k, t.avail - (SELECT count(*) FROM claimed WHERE claimed.partition_key = t.k), now()
          FROM t WHERE t.avail IS NOT NULL
          ON CONFLICT (key) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at
        )
        SELECT NULL::text, NULL::int[], NULL::int[], claimed::{{schema}}.gendurable_instances FROM claimed;
      GET DIAGNOSTICS n = ROW_COUNT;
      got := got + n;
    END LOOP;
  END LOOP;
  next_cursor := cur;
  keys_full := n_full;
  keys_rated := n_rated;
  c := NULL;
  RETURN NEXT;
END
$$;
