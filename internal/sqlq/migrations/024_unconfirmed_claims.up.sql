-- gendurable schema version 24: a claim no heartbeat has confirmed costs no attempt when its lease
-- runs out, once per step (docs/design.md §4, "Claims no heartbeat confirmed"). Every claim (the
-- pick's two, the key hand-off's) writes unstarted_token = -1, which the claim's first heartbeat
-- overwrites (NULL: started, the token: not started). Before, the rows of a pick whose answer was
-- lost (the worker cut off, or killed, between the claim and its first heartbeat) held a lease
-- nobody worked and the reaper charged each an attempt: with MaxAttempts 1 they failed without
-- having run (a probe: 10 jobs behind a link delaying replies 1.5 s, with a 6 s lease). The
-- reaper (Go, sqlq.Reap) and the pick's revoke of an expired key holder read -1 as free unless
-- the row's unconfirmed_freed is the hash of its step: the step of the last unconfirmed claim of
-- the row that went free (a step may have started under such a claim, so a step in a row goes
-- free so only once; kept on the row, not read from the error history, which keeps only the last
-- 20 entries). An int, not the name: the planner's guess at a never-analyzed table's row count
-- shrinks with the width of its columns, and a text[] tipped the list statement's custom plans
-- into sequential scans. A nullable column without a default: no rewrite, no scan. Otherwise
-- version 23's pick and
-- version 18's hand-off, replaced in place (same arguments and results; the revoke's text for a
-- marked holder now reads as the reaper's); CREATE OR REPLACE resets a function's settings, so the
-- generic plans of version 22 are set again.
ALTER TABLE {{schema}}.gendurable_instances ADD COLUMN IF NOT EXISTS unconfirmed_freed int;

CREATE OR REPLACE FUNCTION {{schema}}.gendurable_pick(
  p_queue text, p_limit int, p_lease_us bigint, p_cursor text,
  p_prefixes text[], p_limits int[], p_rates double precision[], p_bursts int[], p_max_keys int,
  p_global int, p_floor timestamptz, p_prios smallint[], p_keyed int)
RETURNS TABLE (next_cursor text, keys_full int[], keys_rated int[], next_floor timestamptz,
               c {{schema}}.gendurable_instances,
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
  kmax     int := least(coalesce(p_keyed, p_limit), p_limit); -- keyed rows at most
  kgot     int := 0;                       -- keyed rows claimed
  -- How far behind its own now() a row may become visible and still be seen by the next pick:
  -- an inserting (or waking) transaction sets eligible_at = its now() and commits a little later.
  floor_slack constant interval := '1 second';
  nfloor   timestamptz := p_floor;         -- the floor returned for the next pick
  lowest   timestamptz := coalesce(p_floor, '-infinity');
  seg_lo   smallint[];                     -- the plain part's priority ranges, in order,
  seg_hi   smallint[];                     --   each scanned from (lo, from)
  seg_from timestamptz[];
  pr       smallint;
  lo       int;
  asked    int;
  plain    int := 0;
  rheld    int[];
  alloc    int[];
  rem      int;
  lvl      int;
  nxt      int;
  cnt      int;
  each     int;                            -- the fair share's even part and odd remainder
  odd      int;
  top      int;                            -- the most any key that got a share now holds
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
    -- The queue's running steps: executing rows with a live lease, and rows
    -- cancelled mid-step (kept their lease, their step runs until its
    -- worker's next heartbeat), retried or not meanwhile.
    SELECT count(*) INTO held FROM {{schema}}.gendurable_instances AS h
    WHERE h.status = 'executing' AND h.lease_expires_at > now() AND h.queue = p_queue;
    SELECT held + count(*) INTO held FROM {{schema}}.gendurable_instances AS h
    WHERE h.status <> 'executing' AND h.lease_expires_at > now() AND h.queue = p_queue;
    total := least(p_limit, greatest(0, p_global - held));
  END IF;
  FOR phase IN 1..2 LOOP
    EXIT WHEN total - got <= 0;
    IF phase = 1 THEN
      -- About half the batch for keyed rows first (an odd share goes either
      -- way at random, so a pick of one row favours neither kind).
      budget := total / 2 + CASE WHEN total % 2 = 1 AND random() < 0.5 THEN 1 ELSE 0 END;
      -- No more of them than the worker has running slots free for (version 23).
      budget := least(budget, kmax);
    ELSE
      budget := total;
      -- Plain rows, in (priority, eligible_at) order, range by range (see the top).
      IF p_floor IS NULL THEN
        seg_lo := ARRAY[-32768]; seg_hi := ARRAY[32767]; seg_from := ARRAY['-infinity'::timestamptz];
      ELSE
        seg_lo := '{}'; seg_hi := '{}'; seg_from := '{}';
        lo := -32768;
        FOR pr IN SELECT DISTINCT u.p FROM unnest(p_prios) AS u(p) WHERE u.p IS NOT NULL ORDER BY u.p LOOP
          IF pr > lo THEN
            seg_lo := seg_lo || lo::smallint; seg_hi := seg_hi || (pr - 1)::smallint;
            seg_from := seg_from || '-infinity'::timestamptz;
          END IF;
          seg_lo := seg_lo || pr; seg_hi := seg_hi || pr; seg_from := seg_from || p_floor;
          lo := pr + 1;
        END LOOP;
        IF lo <= 32767 THEN
          seg_lo := seg_lo || lo::smallint; seg_hi := seg_hi || 32767::smallint;
          seg_from := seg_from || '-infinity'::timestamptz;
        END IF;
      END IF;
      asked := total - got;
      -- One statement for every range, in order: a nested loop over the
      -- ranges, each a seek from its own (lo, from), pulled only until the
      -- batch is full (a range after that is not read, and its rows not
      -- locked). Before version 16 each range was a statement of its own.
      RETURN QUERY
        WITH claimed AS (
          UPDATE {{schema}}.gendurable_instances AS i
          SET status = 'executing',
              lease_expires_at = now() + p_lease_us * interval '1 microsecond',
              claim_token = nextval('{{schema}}.gendurable_claim_token_seq'),
              unstarted_token = -1, -- no heartbeat has confirmed the step started (version 24)
              updated_at = now()
          -- By primary key, as the keyed claim: a join to the ranges' rows
          -- could hash the whole table.
          WHERE i.id = ANY (ARRAY(
                SELECT y.id
                FROM unnest(seg_lo, seg_hi, seg_from) AS sg(lo, hi, sfrom)
                CROSS JOIN LATERAL (
                  SELECT x.id FROM {{schema}}.gendurable_instances AS x
                  WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key IS NULL
                    AND (x.priority, x.eligible_at) >= (sg.lo, sg.sfrom) AND x.priority <= sg.hi
                    AND x.eligible_at >= lowest AND x.eligible_at <= now()
                  ORDER BY x.priority, x.eligible_at
                  LIMIT asked
                  FOR UPDATE SKIP LOCKED) AS y
                LIMIT asked))
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
        SELECT NULL::text, NULL::int[], NULL::int[], NULL::timestamptz, claimed.row, claimed.inbox_rows, claimed.child_rows FROM claimed
        ORDER BY (claimed.row).priority, (claimed.row).eligible_at, (claimed.row).id;
      GET DIAGNOSTICS plain = ROW_COUNT;
      got := got + plain;
      IF plain < asked THEN
        -- Every visible eligible plain row was claimed (or is locked by another transaction).
        nfloor := now() - floor_slack;
      ELSIF plain > 0 THEN
        -- A full plain part: every visible, eligible, unlocked plain row before the last one it
        -- claimed, in (priority, eligible_at) order, was claimed, so the next pick may start at
        -- that row's eligible_at (never above the slack; never below the floor given). The rows
        -- this pick claimed are the plain rows of the queue executing with its lease, exactly:
        -- found through the lease index, O(batch).
        SELECT greatest(lowest, least(now() - floor_slack, l.eligible_at)) INTO nfloor
        FROM {{schema}}.gendurable_instances AS l
        WHERE l.status = 'executing' AND l.lease_expires_at = now() + p_lease_us * interval '1 microsecond'
          AND l.queue = p_queue AND l.partition_key IS NULL
        ORDER BY l.priority DESC, l.eligible_at DESC
        LIMIT 1;
        nfloor := coalesce(nfloor, p_floor);
      END IF;
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
    WHILE got < budget AND kgot < kmax AND visited < p_max_keys AND NOT walked LOOP
      chunk := least(p_max_keys - visited, greatest(16, 2 * (budget - got)));
      -- The next keys with runnable rows below cur ('' : from the top), in
      -- descending order: a loose scan of the keyed pick index, one probe
      -- per key, each a backward seek that lands on the key's tail — its
      -- latest rows, runnable — not on its head, behind the entries of the
      -- rows claimed since the last vacuum (see the top). The row comparison
      -- is where the seek starts (with the queue's equality beside it the
      -- scan would start at the end of the queue's keys), queue >= p_queue
      -- where it ends: below the queue's lowest key a probe would read on
      -- through the other queues' entries until one visible to it, however
      -- many (a review: 100k heap fetches past a finished queue). The queue
      -- is checked on the one entry found. Only the keyed pick index serves that order
      -- (the index of migration 004 holds every row of a key, done ones
      -- too). Past the wrap, only keys down to the cursor the walk started
      -- from.
      WITH RECURSIVE w(k, i) AS (
        SELECT CASE WHEN cur = '' THEN
                 (SELECT x.partition_key FROM {{schema}}.gendurable_instances AS x
                  WHERE x.status = 'runnable' AND x.queue = p_queue AND x.partition_key IS NOT NULL
                  ORDER BY x.queue DESC, x.partition_key DESC LIMIT 1)
               ELSE
                 (SELECT z.k FROM (
                    SELECT x.queue AS q, x.partition_key AS k FROM {{schema}}.gendurable_instances AS x
                    WHERE x.status = 'runnable' AND x.partition_key IS NOT NULL
                      AND (x.queue, x.partition_key) < (p_queue, cur) AND x.queue >= p_queue
                    ORDER BY x.queue DESC, x.partition_key DESC LIMIT 1) AS z
                  WHERE z.q = p_queue)
               END, 1
        UNION ALL
        SELECT (SELECT z.k FROM (
                  SELECT x.queue AS q, x.partition_key AS k FROM {{schema}}.gendurable_instances AS x
                  WHERE x.status = 'runnable' AND x.partition_key IS NOT NULL
                    AND (x.queue, x.partition_key) < (p_queue, w.k) AND x.queue >= p_queue
                  ORDER BY x.queue DESC, x.partition_key DESC LIMIT 1) AS z
                WHERE z.q = p_queue), w.i + 1
        FROM w WHERE w.k IS NOT NULL AND w.i < chunk)
      SELECT array_agg(w.k ORDER BY w.i) FILTER (WHERE NOT (wrapped AND start <> '' AND w.k < start)),
             bool_or(wrapped AND start <> '' AND w.k < start)
        INTO ks, past
      FROM w WHERE w.k IS NOT NULL;
      IF ks IS NULL THEN
        IF wrapped OR past THEN
          -- Past the cursor the walk began at, or at the end after the
          -- wrap: every key has been visited.
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
      -- A holder a heartbeat had marked not started, and whose step and
      -- attempt have not gone free before, or one no heartbeat has written
      -- since its claim (-1, version 24) whose step is not the one
      -- unconfirmed_freed names (free: the reaper's rule, docs/design.md §4), goes
      -- back to runnable here as the reaper would put it — no attempt, an
      -- uncharged lease_expired entry, its eligible_at kept — so that the
      -- claims below take it first, ahead of the rows of its key behind it
      -- (version 23; before, they claimed the next row, and it ran after
      -- that one). Another holder marked not started keeps that, as 0, for
      -- the reaper (version 17; docs/design.md §4, "Prefetched claims").
      UPDATE {{schema}}.gendurable_instances AS i
      SET status = CASE WHEN r.free THEN 'runnable'::{{schema}}.gendurable_status ELSE i.status END,
          lease_expires_at = CASE WHEN r.free THEN NULL ELSE i.lease_expires_at END,
          claim_token = NULL,
          unstarted_token = CASE WHEN r.free THEN i.unstarted_token
                                 WHEN i.unstarted_token = i.claim_token THEN 0 END,
          updated_at = CASE WHEN r.free THEN now() ELSE i.updated_at END,
          unconfirmed_freed = CASE WHEN r.free AND i.unstarted_token = -1 THEN hashtext(i.step)
                                   ELSE i.unconfirmed_freed END,
          -- 20: sqlq.MaxErrorHistory, as the reaper keeps it.
          errors = CASE WHEN NOT r.free THEN i.errors
                   ELSE (CASE WHEN jsonb_array_length(i.errors) >= 20 THEN i.errors - 0 ELSE i.errors END)
                        || jsonb_build_array(jsonb_build_object(
                             'step', i.step, 'attempt', i.attempt, 'at', now(), 'kind', 'lease_expired',
                             'token', i.claim_token, 'uncharged', true,
                             'error', CASE WHEN i.unstarted_token = -1
                                      THEN 'lease expired before any heartbeat confirmed the step started (the worker crashed, stalled or was cut off soon after the claim, or the claim''s answer was lost); no attempt charged, once per visit of the step'
                                      ELSE 'lease expired before the step started (a prefetched claim; the worker crashed, stalled or was cut off); no attempt charged' END)
                           || CASE WHEN i.unstarted_token = -1 THEN '{"unconfirmed": true}'::jsonb ELSE '{}'::jsonb END)
                   END
      FROM (SELECT h.id, coalesce(h.status = 'executing' AND (
                     (h.unstarted_token = h.claim_token
                      AND NOT h.errors @> jsonb_build_array(jsonb_build_object(
                            'kind', 'lease_expired', 'uncharged', true, 'step', h.step, 'attempt', h.attempt)))
                     OR (h.unstarted_token = -1 AND h.unconfirmed_freed IS DISTINCT FROM hashtext(h.step))), false) AS free
            FROM unnest(locked) AS u(k) CROSS JOIN LATERAL (
              SELECT h.id, h.status, h.unstarted_token, h.claim_token, h.errors, h.step, h.attempt, h.unconfirmed_freed
              FROM {{schema}}.gendurable_instances AS h
              WHERE h.partition_key = u.k AND h.lease_expires_at IS NOT NULL
                AND h.lease_expires_at <= now() AND h.claim_token IS NOT NULL
              FOR NO KEY UPDATE SKIP LOCKED) AS h) AS r
      WHERE i.id = r.id;
      -- Each key's room: limit − holders, and a rated key's tokens; keys with
      -- nothing eligible drop out.
      SELECT array_agg(r.k ORDER BY r.ord), array_agg(r.take ORDER BY r.ord),
             array_agg(r.avail ORDER BY r.ord), array_agg(r.pol_l ORDER BY r.ord),
             array_agg(r.full_pol) FILTER (WHERE r.full_pol IS NOT NULL),
             array_agg(r.rated_pol) FILTER (WHERE r.rated_pol IS NOT NULL),
             array_agg(r.held ORDER BY r.ord)
        INTO rk, rtake, ravail, rlim, rfull, rrated, rheld
      FROM (
        SELECT q.k, q.ord, q.avail, q.pol_l, q.held,
               CASE WHEN q.free <= 0 THEN q.pol END AS full_pol,
               CASE WHEN q.free > 0 AND q.avail < 1 THEN q.pol END AS rated_pol,
               greatest(0, least(q.free, coalesce(floor(q.avail)::int, q.free))) AS take
        FROM (
          SELECT u.k, u.ord, coalesce(p.ord, 0) + 1 AS pol, coalesce(p.l, 1) AS pol_l, held.n AS held,
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
            -- Live leases, then expired ones a claim still holds: two ranges
            -- of the key-holders index on (partition_key, lease_expires_at),
            -- so no statistics make the key's other rows worth reading
            -- (one OR of the two made the partition_key index, which holds
            -- every row of the key, as cheap to the planner: version 18).
            SELECT (SELECT count(*) FROM {{schema}}.gendurable_instances AS h
                    WHERE h.partition_key = u.k AND h.lease_expires_at > now())::int
                 + (SELECT count(*) FROM {{schema}}.gendurable_instances AS h
                    WHERE h.partition_key = u.k AND h.lease_expires_at <= now()
                      AND h.claim_token IS NOT NULL)::int AS n) AS held
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
      -- Share what is left of the batch between the chunk's keys by fair share
      -- (docs/design.md §6, "Fairness"): a key's share raises the keys holding
      -- the fewest slots first (held + given so far), each up to what it can
      -- take; keys level with each other get the same, an odd remainder going
      -- in walk order. A tenant holding every slot gets nothing more while
      -- another tenant holds fewer and has rows waiting.
      rem := least(budget - got, kmax - kgot);
      IF (SELECT sum(u.t) FROM unnest(rtake) AS u(t)) <= rem THEN
        alloc := rtake;
      ELSE
        alloc := array_fill(0, ARRAY[cardinality(rk)]);
        WHILE rem > 0 LOOP
          lvl := NULL;
          FOR e IN 1..cardinality(rk) LOOP
            IF alloc[e] < rtake[e] AND (lvl IS NULL OR rheld[e] + alloc[e] < lvl) THEN
              lvl := rheld[e] + alloc[e];
            END IF;
          END LOOP;
          EXIT WHEN lvl IS NULL;
          -- The keys at the lowest level rise together to the next level (or
          -- the lowest of their own caps).
          cnt := 0;
          nxt := NULL;
          FOR e IN 1..cardinality(rk) LOOP
            IF alloc[e] < rtake[e] THEN
              IF rheld[e] + alloc[e] = lvl THEN
                cnt := cnt + 1;
                nxt := least(nxt, rheld[e] + rtake[e]);
              ELSE
                nxt := least(nxt, rheld[e] + alloc[e]);
              END IF;
            END IF;
          END LOOP;
          IF cnt * (nxt - lvl) <= rem THEN
            each := nxt - lvl;
            odd := 0;
          ELSE
            each := rem / cnt;
            odd := rem % cnt;
          END IF;
          FOR e IN 1..cardinality(rk) LOOP
            IF alloc[e] < rtake[e] AND rheld[e] + alloc[e] = lvl THEN
              n := each + CASE WHEN odd > 0 THEN 1 ELSE 0 END;
              odd := greatest(odd - 1, 0);
              alloc[e] := alloc[e] + n;
              rem := rem - n;
            END IF;
          END LOOP;
        END LOOP;
      END IF;
      -- A key left with nothing while another key of the chunk was raised
      -- above what it holds (it lost the odd remainder of a tie, or the batch
      -- ran out before it) gets its turn first in the next pick: the cursor
      -- stops before it. A key that got part of what it could take has had
      -- its turn; so has one left out because it holds more than every key
      -- that got a share (else it would hold the cursor, and the keys past
      -- the chunk would wait, for as long as its own steps run).
      top := NULL;
      FOR e IN 1..cardinality(rk) LOOP
        IF alloc[e] > 0 THEN
          top := greatest(top, rheld[e] + alloc[e]);
        END IF;
      END LOOP;
      FOR e IN 1..cardinality(rk) LOOP
        IF rtake[e] > 0 AND alloc[e] = 0 AND rheld[e] < top THEN
          cur := coalesce((SELECT min(u.k) FROM unnest(ks) AS u(k) WHERE u.k > rk[e]), prev);
          walked := false;
          EXIT;
        END IF;
      END LOOP;
      -- Claim each key's share, each row only while its own key_limit allows
      -- (the holders and the rows before it in this claim count); spend the
      -- rated keys' tokens.
      RETURN QUERY
        WITH t AS (
          SELECT u.k, u.take, u.avail, u.pol_l, u.n, u.held
          FROM unnest(rk, rtake, ravail, rlim, alloc, rheld) AS u(k, take, avail, pol_l, n, held)
        ), cand AS (
          SELECT x.id, x.ok, bool_and(x.ok) OVER (PARTITION BY t.k ORDER BY x.rn) AS go
          FROM t CROSS JOIN LATERAL (
            -- The key's holders as the room statement counted them: under the
            -- key's lock only this transaction adds holders, so the count can
            -- only have fallen since (one count per key, not per row).
            SELECT y.id, row_number() OVER w AS rn,
                   coalesce(y.key_limit, t.pol_l) >= t.held + row_number() OVER w AS ok
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
              unstarted_token = -1, -- no heartbeat has confirmed the step started (version 24)
              updated_at = now()
          -- By primary key: a join to cand could hash the whole table.
          WHERE i.id = ANY (ARRAY(SELECT cand.id FROM cand WHERE cand.go))
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
        SELECT NULL::text, NULL::int[], NULL::int[], NULL::timestamptz, claimed.row, claimed.inbox_rows, claimed.child_rows FROM claimed;
      GET DIAGNOSTICS n = ROW_COUNT;
      got := got + n;
      kgot := kgot + n;
    END LOOP;
  END LOOP;
  next_cursor := cur;
  keys_full := n_full;
  keys_rated := n_rated;
  next_floor := nfloor;
  c := NULL;
  inbox_rows := NULL;
  child_rows := NULL;
  RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.gendurable_handoff(
  p_keys text[], p_queues text[], p_limits int[], p_freed bigint[], p_skip bigint[], p_lease_us bigint)
RETURNS TABLE (c {{schema}}.gendurable_instances, inbox_rows jsonb, child_rows jsonb)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  ns     int := hashtext('gendurable:' || trim(both '"' from '{{schema}}'));
  q      text;
  paused text[] := '{}';
  lk   text[];
  lq   text[];
  lnum int[];
  llim int[];
BEGIN
  IF coalesce(cardinality(p_keys), 0) = 0
     OR current_setting('transaction_isolation') <> 'read committed' THEN
    RETURN;
  END IF;
  -- A paused queue hands nothing on (one primary-key probe per queue, as
  -- the pick's).
  FOR q IN SELECT DISTINCT x.q FROM unnest(p_queues) AS x(q) LOOP
    IF EXISTS (SELECT 1 FROM {{schema}}.gendurable_queues AS qp WHERE qp.name = q AND qp.paused) THEN
      paused := paused || q;
    END IF;
  END LOOP;
  -- The pairs whose key no pick or other hand-off holds.
  SELECT array_agg(u.k), array_agg(u.q), array_agg(u.n), array_agg(u.l)
    INTO lk, lq, lnum, llim
  FROM (SELECT x.k, x.q, count(*)::int AS n, max(x.l) AS l
        FROM unnest(p_keys, p_queues, p_limits) AS x(k, q, l)
        WHERE x.q <> ALL (paused)
        GROUP BY x.k, x.q) AS u
  WHERE pg_try_advisory_xact_lock(ns, hashtext(u.k));
  IF lk IS NULL THEN
    RETURN;
  END IF;
  -- A fresh snapshot from here: every claim committed before the locks.
  RETURN QUERY
    WITH t AS MATERIALIZED (
      -- A key's holders, once per key: two ranges of the key-holders index,
      -- as the pick counts them (version 18).
      SELECT u.k, u.q, u.n, u.l,
             (SELECT count(*) FROM {{schema}}.gendurable_instances AS h
              WHERE h.partition_key = u.k AND h.lease_expires_at > now()
                AND h.id <> ALL (p_freed))::int
           + (SELECT count(*) FROM {{schema}}.gendurable_instances AS h
              WHERE h.partition_key = u.k AND h.lease_expires_at <= now()
                AND h.claim_token IS NOT NULL AND h.id <> ALL (p_freed))::int AS held
      FROM unnest(lk, lq, lnum, llim) AS u(k, q, n, l)
    ), pre AS (
      SELECT t.k, t.q, t.l, t.held, y.id, y.key_limit, y.priority, y.eligible_at
      FROM t
      CROSS JOIN LATERAL (
        SELECT y.id, y.key_limit, y.priority, y.eligible_at FROM {{schema}}.gendurable_instances AS y
        WHERE y.status = 'runnable' AND y.queue = t.q AND y.partition_key = t.k AND y.eligible_at <= now()
          AND y.id <> ALL (p_skip)
        ORDER BY y.priority, y.eligible_at
        LIMIT t.n
        FOR UPDATE SKIP LOCKED) AS y
    ), cand AS (
      SELECT r.id, bool_and(coalesce(r.key_limit, r.l, 1) >= r.held + r.rn)
                     OVER (PARTITION BY r.k ORDER BY r.rn) AS go
      FROM (SELECT y.*, row_number() OVER (PARTITION BY y.k ORDER BY y.q, y.priority, y.eligible_at, y.id) AS rn
            FROM pre AS y) AS r
    ), claimed AS (
      UPDATE {{schema}}.gendurable_instances AS i
      SET status = 'executing',
          lease_expires_at = now() + p_lease_us * interval '1 microsecond',
          claim_token = nextval('{{schema}}.gendurable_claim_token_seq'),
          unstarted_token = -1, -- no heartbeat has confirmed the step started (version 24)
          updated_at = now()
      -- By primary key, as the pick's claim (migration 009).
      WHERE i.id = ANY (ARRAY(SELECT cand.id FROM cand WHERE cand.go))
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
    )
    SELECT claimed.row, claimed.inbox_rows, claimed.child_rows FROM claimed;
END
$$;
ALTER FUNCTION {{schema}}.gendurable_pick(text, int, bigint, text, text[], int[], double precision[], int[], int,
                                        int, timestamptz, smallint[], int)
  SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION {{schema}}.gendurable_handoff(text[], text[], int[], bigint[], bigint[], bigint)
  SET plan_cache_mode = force_generic_plan;
