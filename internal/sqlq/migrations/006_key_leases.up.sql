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
-- counts them like its own; its per-key lock is the same advisory lock (same
-- namespace) that those engines hold for a running step, so a new pick skips a key
-- an old engine is running. Old engines' picks lose their index here and scan: stop
-- them before upgrading a large table.
--
-- The indexes below block writes while they build, and DROP INDEX takes the table's
-- exclusive lock until the migration commits: on a large table, build them
-- CONCURRENTLY by hand first, with these names and definitions, and this migration
-- only drops the two it replaces.

-- Plain rows and keyed rows are picked by different index paths, so a hot key's
-- backlog never lies in the way of the plain pick's LIMIT, nor of another key's.
CREATE INDEX IF NOT EXISTS gendurable_instances_pick_plain
  ON {{schema}}.gendurable_instances (queue, priority, eligible_at)
  WHERE status = 'runnable' AND partition_key IS NULL;
CREATE INDEX IF NOT EXISTS gendurable_instances_pick_keyed
  ON {{schema}}.gendurable_instances (queue, partition_key, priority, eligible_at)
  WHERE status = 'runnable' AND partition_key IS NOT NULL;

-- A key's slot holders: its rows with a lease — executing ones, and ones an operator
-- cancelled mid-step, whose step may run until its worker hears of it.
CREATE INDEX IF NOT EXISTS gendurable_instances_key_holders
  ON {{schema}}.gendurable_instances (partition_key, lease_expires_at) INCLUDE (claim_token)
  WHERE partition_key IS NOT NULL AND lease_expires_at IS NOT NULL;

-- key_limit: the most rows of this row's key that may run at once (per-insert
-- InsertOpts.KeyLimit); NULL: the engine's KeyPolicy for the key, else 1. After the
-- index builds, so they block only writes, not reads; the check NOT VALID (every
-- row's value is NULL here, and new rows are checked), so adding it reads no row
-- under the table's exclusive lock.
ALTER TABLE {{schema}}.gendurable_instances
  ADD COLUMN key_limit int,
  ADD CONSTRAINT gendurable_instances_key_limit_positive CHECK (key_limit > 0) NOT VALID;

DROP INDEX IF EXISTS {{schema}}.gendurable_instances_pick;
DROP INDEX IF EXISTS {{schema}}.gendurable_instances_partition_active;

-- A rated key's token bucket (KeyPolicy.Rate): tokens left as of refilled_at.
-- Written only by the pick, under the key's lock.
CREATE TABLE {{schema}}.gendurable_key_buckets (
  key         text PRIMARY KEY,
  tokens      double precision NOT NULL,
  refilled_at timestamptz NOT NULL
);

-- gendurable_pick claims up to p_limit runnable rows of p_queue with a lease of
-- p_lease_us microseconds and returns them (c) with what their steps read besides
-- (inbox_rows: the unconsumed signals, when the inbox counts are not empty;
-- child_rows: the latest fan-out's children) — read by the statement that claimed
-- them, whose snapshot sees every signal the claimed row's counts do (the same
-- JSON as inboxRowsSQL and childRowsSQL in hotpath.go) — then one last row with c NULL whose
-- next_cursor is where the next pick's walk over keys starts, and which counts the
-- keys it found full (keys_full) or out of starts (keys_rated), by policy: element
-- i+1 for p_prefixes[i], element 1 for keys no policy matches (docs/design.md §6).
--
-- Keyed rows are taken a chunk of keys at a time, round robin: the walk starts
-- after p_cursor, goes up the keys that have runnable rows in this queue and wraps
-- around once, visiting at most p_max_keys keys. Per chunk: a loose scan for the next
-- keys; a look, without locks, at which of them seem to have room; a
-- transaction-level advisory lock on those (a key another pick holds is skipped);
-- then, in fresh snapshots that see every claim committed before the locks were
-- granted: the key's holders whose lease ran out are revoked (their claim token is
-- cleared, so their heartbeat, outcome or chained step can no longer take the slot
-- back; a holder whose row is locked at that moment — its heartbeat or outcome is
-- being written — counts as holding); each key's room is its limit (the head row's
-- key_limit, else the longest of p_prefixes it starts with, else 1) minus its
-- holders (a lease, and the lease is live or its claim token is still set), and no
-- more than its token bucket holds if that policy has a rate (p_rates: starts per
-- second, 0 for none; p_bursts: the bucket's size); and last its rows are claimed
-- in (priority, eligible_at) order, each only while its own key_limit allows.
--
-- Keyed rows get about half the batch first when plain rows wait too; plain rows get
-- the rest, in (priority, eligible_at) order; keyed rows fill what is left.
--
-- p_global > 0 bounds the queue's running steps across every process
-- (QueueConfig.GlobalConcurrency): under a transaction-level lock of the queue, its
-- executing rows with a live lease are counted and the batch shrinks to what is
-- left. That count reads the live leases of every queue (the lease index), so it
-- costs O(executing rows) — paid only by queues that set it.
--
-- Read committed only: the fresh snapshots are what make the locks work.
CREATE FUNCTION {{schema}}.gendurable_pick(
  p_queue text, p_limit int, p_lease_us bigint, p_cursor text,
  p_prefixes text[], p_limits int[], p_rates double precision[], p_bursts int[], p_max_keys int,
  p_global int)
RETURNS TABLE (next_cursor text, keys_full int[], keys_rated int[], c {{schema}}.gendurable_instances,
               inbox_rows jsonb, child_rows jsonb)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  ns       int := hashtext('gendurable:' || trim(both '"' from '{{schema}}'));
  got      int := 0;
  n        int;
  budget   int;
  held     int;
  chunk    int;
  e        int;
  acc      int;
  start    text;                             -- where this phase's walk began
  cur      text;
  prev     text;
  wrapped  boolean;
  walked   boolean := false;                 -- every key was visited once
  past     boolean;
  visited  int := 0;
  ks       text[];
  maybe    text[];
  locked   text[];
  rk       text[];
  rtake    int[];
  rlim     int[];
  ravail   double precision[];
  rfull    int[];
  rrated   int[];
  n_full   int[] := array_fill(0, ARRAY[coalesce(array_length(p_prefixes, 1), 0) + 1]);
  n_rated  int[] := array_fill(0, ARRAY[coalesce(array_length(p_prefixes, 1), 0) + 1]);
  total    int := p_limit;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'gendurable_pick needs READ COMMITTED, not %', current_setting('transaction_isolation')
      USING ERRCODE = '25001';
  END IF;
  IF EXISTS (SELECT 1 FROM {{schema}}.gendurable_queues AS qp WHERE qp.name = p_queue AND qp.paused) THEN
    RETURN;
  END IF;
  IF p_global > 0 THEN
    PERFORM pg_advisory_xact_lock(ns, hashtext('gendurable:queue:' || p_queue));
    SELECT count(*) INTO held FROM {{schema}}.gendurable_instances AS h
    WHERE h.status = 'executing' AND h.lease_expires_at > now() AND h.queue = p_queue;
    total := least(p_limit, greatest(0, p_global - held));
  END IF;
  FOR phase IN 1..2 LOOP
    EXIT WHEN total - got <= 0;
    IF phase = 1 THEN
      -- About half the batch for keyed rows first (an odd share goes either
      -- way at random, so a pick of one row favours neither kind).
      budget := total / 2 + CASE WHEN total % 2 = 1 AND random() < 0.5 THEN 1 ELSE 0 END;
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
          RETURNING i AS row,
            CASE WHEN i.inbox <> '{}'::jsonb THEN
              (SELECT jsonb_agg(jsonb_build_object('id', s.id, 'name', s.name, 'payload', s.payload,
                                                   'at', s.inserted_at) ORDER BY s.id)
               FROM {{schema}}.gendurable_signals AS s
               WHERE s.target_id = i.id AND s.consumed_at IS NULL) END AS inbox_rows,
            CASE WHEN i.children_total > 0 THEN
              (SELECT jsonb_agg(jsonb_build_object('id', ch.id, 'fsm', ch.fsm, 'version', ch.fsm_version,
                                                   'step', ch.step, 'status', ch.status, 'result', ch.result,
                                                   'finished_at', ch.finished_at) ORDER BY ch.id)
               FROM {{schema}}.gendurable_instances AS ch
               WHERE ch.parent_id = i.id AND ch.parent_fanout = i.fanout) END AS child_rows)
        SELECT NULL::text, NULL::int[], NULL::int[], claimed.row, claimed.inbox_rows, claimed.child_rows FROM claimed;
      GET DIAGNOSTICS n = ROW_COUNT;
      got := got + n;
    END IF;
    -- Keyed rows. Phase 1 walks from the cursor; phase 2 goes on from where
    -- the batch ran out in phase 1, around once (so a key that got part of
    -- its room in phase 1 gets the rest last) — and walks nothing if phase 1
    -- visited every key without running out.
    IF phase = 1 THEN
      start := coalesce(p_cursor, '');
    ELSIF walked THEN
      CONTINUE;
    ELSE
      start := cur;
    END IF;
    cur := start;
    wrapped := start = '';
    walked := false;
    WHILE got < budget AND visited < p_max_keys AND NOT walked LOOP
      chunk := least(p_max_keys - visited, greatest(16, 2 * (budget - got)));
      -- The next keys with runnable rows after cur, in order: a loose scan of
      -- the keyed pick index, one probe per key (the row comparison is a seek
      -- only that index can serve: the index of migration 004 holds every
      -- row of a key, done ones too). Past the wrap, only keys up to the
      -- cursor the walk started from.
      WITH RECURSIVE w(k, i) AS (
        (SELECT x.partition_key, 1 FROM {{schema}}.gendurable_instances AS x
         WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key IS NOT NULL
           AND (x.queue, x.partition_key) > (p_queue, cur)
         ORDER BY x.queue, x.partition_key LIMIT 1)
        UNION ALL
        SELECT (SELECT x.partition_key FROM {{schema}}.gendurable_instances AS x
                WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key IS NOT NULL
                  AND (x.queue, x.partition_key) > (p_queue, w.k)
                ORDER BY x.queue, x.partition_key LIMIT 1), w.i + 1
        FROM w WHERE w.k IS NOT NULL AND w.i < chunk)
      SELECT array_agg(w.k ORDER BY w.i) FILTER (WHERE NOT (wrapped AND start <> '' AND w.k > start)),
             bool_or(wrapped AND start <> '' AND w.k > start)
        INTO ks, past
      FROM w WHERE w.k IS NOT NULL;
      IF ks IS NULL THEN
        EXIT WHEN wrapped OR past;
        wrapped := true;
        cur := '';
        CONTINUE;
      END IF;
      walked := coalesce(past, false);
      visited := visited + cardinality(ks);
      prev := cur;
      cur := ks[cardinality(ks)];
      -- Which keys seem to have room, without locks: only those are locked
      -- (and the full ones counted).
      SELECT array_agg(v.k ORDER BY v.ord) FILTER (WHERE v.room),
             array_agg(v.pol) FILTER (WHERE NOT v.room)
        INTO maybe, rfull
      FROM (
        SELECT u.k, u.ord, coalesce(p.ord, 0) + 1 AS pol,
               coalesce(head.key_limit, p.l, 1) > (
                 SELECT count(*) FROM {{schema}}.gendurable_instances AS h
                 WHERE h.partition_key = u.k AND h.lease_expires_at > now()) AS room
        FROM unnest(ks) WITH ORDINALITY AS u(k, ord)
        CROSS JOIN LATERAL (
          SELECT x.key_limit FROM {{schema}}.gendurable_instances AS x
          WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key = u.k AND x.eligible_at <= now()
          ORDER BY x.priority, x.eligible_at LIMIT 1) AS head
        LEFT JOIN LATERAL (
          SELECT pp.l, pp.ord FROM unnest(p_prefixes, p_limits) WITH ORDINALITY AS pp(prefix, l, ord)
          WHERE starts_with(u.k, pp.prefix) ORDER BY length(pp.prefix) DESC LIMIT 1) AS p ON true
      ) AS v;
      FOR e IN 1..coalesce(cardinality(rfull), 0) LOOP
        n_full[rfull[e]] := n_full[rfull[e]] + 1;
      END LOOP;
      -- Those no other pick is claiming now. Locks first; the statements after
      -- take snapshots that see every claim committed before the locks.
      SELECT array_agg(u.k ORDER BY u.ord) INTO locked
      FROM unnest(maybe) WITH ORDINALITY AS u(k, ord)
      WHERE pg_try_advisory_xact_lock(ns, hashtext(u.k));
      CONTINUE WHEN locked IS NULL;
      -- Revoke the holders whose lease ran out: a cleared claim token fences
      -- their heartbeat, outcome and chained step. A row locked right now
      -- (its heartbeat or outcome is being written) is left, and holds.
      UPDATE {{schema}}.gendurable_instances AS i SET claim_token = NULL
      FROM (SELECT h.id FROM unnest(locked) AS u(k) CROSS JOIN LATERAL (
              SELECT h.id FROM {{schema}}.gendurable_instances AS h
              WHERE h.partition_key = u.k AND h.lease_expires_at IS NOT NULL
                AND h.lease_expires_at <= now() AND h.claim_token IS NOT NULL
              FOR NO KEY UPDATE SKIP LOCKED) AS h) AS r
      WHERE i.id = r.id;
      -- Each key's room: limit − holders, and a rated key's tokens; keys with
      -- nothing eligible drop out.
      SELECT array_agg(r.k ORDER BY r.ord), array_agg(r.take ORDER BY r.ord),
             array_agg(r.avail ORDER BY r.ord), array_agg(r.pol_l ORDER BY r.ord),
             array_agg(r.full_pol) FILTER (WHERE r.full_pol IS NOT NULL),
             array_agg(r.rated_pol) FILTER (WHERE r.rated_pol IS NOT NULL)
        INTO rk, rtake, ravail, rlim, rfull, rrated
      FROM (
        SELECT q.k, q.ord, q.avail, q.pol_l,
               CASE WHEN q.free <= 0 THEN q.pol END AS full_pol,
               CASE WHEN q.free > 0 AND q.avail < 1 THEN q.pol END AS rated_pol,
               greatest(0, least(q.free, coalesce(floor(q.avail)::int, q.free))) AS take
        FROM (
          SELECT u.k, u.ord, coalesce(p.ord, 0) + 1 AS pol, coalesce(p.l, 1) AS pol_l,
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
            WHERE h.partition_key = u.k AND h.lease_expires_at IS NOT NULL
              AND (h.lease_expires_at > now() OR h.claim_token IS NOT NULL)) AS held
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
      -- Claim each key's rows in walk order within what is left of the batch,
      -- each row only while its own key_limit allows (the holders and the
      -- rows before it in this claim count); spend the rated keys' tokens.
      RETURN QUERY
        WITH t AS (
          SELECT u.k, u.take, u.avail, u.pol_l,
                 least(u.take, greatest(0, (budget - got) - coalesce(sum(u.take) OVER (
                   ORDER BY u.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0))) AS n
          FROM unnest(rk, rtake, ravail, rlim) WITH ORDINALITY AS u(k, take, avail, pol_l, ord)
        ), cand AS (
          SELECT x.id, x.ok, bool_and(x.ok) OVER (PARTITION BY t.k ORDER BY x.rn) AS go
          FROM t CROSS JOIN LATERAL (
            SELECT y.id, row_number() OVER w AS rn, coalesce(y.key_limit, t.pol_l) >= (
                     SELECT count(*) FROM {{schema}}.gendurable_instances AS h
                     WHERE h.partition_key = t.k AND h.lease_expires_at IS NOT NULL
                       AND (h.lease_expires_at > now() OR h.claim_token IS NOT NULL)) + row_number() OVER w AS ok
            FROM (SELECT y.id, y.key_limit, y.priority, y.eligible_at FROM {{schema}}.gendurable_instances AS y
                  WHERE y.status = 'runnable' AND y.queue = p_queue AND y.partition_key = t.k
                    AND y.eligible_at <= now()
                  ORDER BY y.priority, y.eligible_at
                  LIMIT t.n
                  FOR UPDATE SKIP LOCKED) AS y
            WINDOW w AS (ORDER BY y.priority, y.eligible_at, y.id)) AS x
          WHERE t.n > 0
        ), claimed AS (
          UPDATE {{schema}}.gendurable_instances AS i
          SET status = 'executing',
              lease_expires_at = now() + p_lease_us * interval '1 microsecond',
              claim_token = nextval('{{schema}}.gendurable_claim_token_seq'),
              updated_at = now()
          FROM cand
          WHERE i.id = cand.id AND cand.go
          RETURNING i AS row,
            CASE WHEN i.inbox <> '{}'::jsonb THEN
              (SELECT jsonb_agg(jsonb_build_object('id', s.id, 'name', s.name, 'payload', s.payload,
                                                   'at', s.inserted_at) ORDER BY s.id)
               FROM {{schema}}.gendurable_signals AS s
               WHERE s.target_id = i.id AND s.consumed_at IS NULL) END AS inbox_rows,
            CASE WHEN i.children_total > 0 THEN
              (SELECT jsonb_agg(jsonb_build_object('id', ch.id, 'fsm', ch.fsm, 'version', ch.fsm_version,
                                                   'step', ch.step, 'status', ch.status, 'result', ch.result,
                                                   'finished_at', ch.finished_at) ORDER BY ch.id)
               FROM {{schema}}.gendurable_instances AS ch
               WHERE ch.parent_id = i.id AND ch.parent_fanout = i.fanout) END AS child_rows
        ), spent AS (
          INSERT INTO {{schema}}.gendurable_key_buckets AS b (key, tokens, refilled_at)
          SELECT t.k, t.avail - (SELECT count(*) FROM claimed WHERE (claimed.row).partition_key = t.k), now()
          FROM t WHERE t.avail IS NOT NULL
          ON CONFLICT (key) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at
        )
        SELECT NULL::text, NULL::int[], NULL::int[], claimed.row, claimed.inbox_rows, claimed.child_rows FROM claimed;
      GET DIAGNOSTICS n = ROW_COUNT;
      got := got + n;
    END LOOP;
  END LOOP;
  next_cursor := cur;
  keys_full := n_full;
  keys_rated := n_rated;
  c := NULL;
  inbox_rows := NULL;
  child_rows := NULL;
  RETURN NEXT;
END
$$;
