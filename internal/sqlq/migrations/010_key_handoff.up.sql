-- gendurable schema version 10: the key hand-off (docs/design.md §6). The outcome
-- statement that frees keyed rows' slots claims their keys' next rows itself,
-- through gendurable_handoff, so a key's next row need not wait for the next pick.
-- Nothing else changes: engines of version 9 keep working on this schema (their
-- outcome statements do not call the function).

-- gendurable_handoff claims, for each (key, queue) pair of p_keys/p_queues, up to as
-- many runnable rows of that key in that queue as the pair occurs (one for each freed
-- row that may hand off: a key's holders never grow), eligible now, in (priority,
-- eligible_at) order, FOR UPDATE SKIP LOCKED, stamped as the pick stamps a claim
-- (executing, a lease of p_lease_us microseconds, a fresh claim token), and returns
-- them as the pick does (c, inbox_rows, child_rows). It is serialized with the pick
-- as the pick serializes per key: a key is handled only if a try of its
-- transaction-level advisory lock (the pick's namespace) succeeds — a key a pick or
-- another hand-off is working on is left to the pick — and only in a queue that is
-- not paused. Then, in a fresh snapshot that sees every claim committed before the
-- lock was granted, a row is claimed only while its own key_limit (else p_limits,
-- the policy limit the engine passes, else 1) is above the key's holders (counted
-- as the pick counts them, leaving out p_freed: the rows the calling statement
-- frees) plus the rows before it in this claim.
--
-- p_skip are rows the calling statement writes (its outcome rows and their parents):
-- never candidates, since a row updated here must not be updated again by the
-- calling statement. It needs read committed (for the fresh snapshot); under
-- another isolation level it claims nothing. It never waits on a lock: the key locks
-- are tried, the rows skipped if locked.
CREATE FUNCTION {{schema}}.gendurable_handoff(
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
    WITH t AS (
      SELECT u.k, u.q, u.n, u.l FROM unnest(lk, lq, lnum, llim) AS u(k, q, n, l)
    ), pre AS (
      SELECT t.k, t.q, t.l, held.n AS held, y.id, y.key_limit, y.priority, y.eligible_at
      FROM t
      CROSS JOIN LATERAL (
        SELECT count(*)::int AS n FROM {{schema}}.gendurable_instances AS h
        WHERE h.partition_key = t.k AND h.lease_expires_at IS NOT NULL
          AND (h.lease_expires_at > now() OR h.claim_token IS NOT NULL)
          AND h.id <> ALL (p_freed)) AS held
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
