-- Back to version 23: claims leave unstarted_token as it was, and a revoked key holder goes back
-- to runnable uncharged only if a heartbeat marked it not started. Version 23's pick is its up
-- migration run again (dropped first: it creates the function, with its generic plans); version
-- 18's hand-off, body as it was (its up migration would also put back version 18's
-- twelve-argument pick, which version 21 replaced), its plans generic as version 22 set them.
-- Marks of -1 left on rows are read by version 23's reaper as no mark: those claims are charged,
-- as before. The step recorded as gone free unconfirmed is dropped with its column.
DROP FUNCTION {{schema}}.gendurable_pick(text, int, bigint, text, text[], int[], double precision[], int[], int,
                                        int, timestamptz, smallint[], int);
-- include: 023_keyed_room.up.sql
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
ALTER FUNCTION {{schema}}.gendurable_handoff(text[], text[], int[], bigint[], bigint[], bigint)
  SET plan_cache_mode = force_generic_plan;
ALTER TABLE {{schema}}.gendurable_instances DROP COLUMN IF EXISTS unconfirmed_freed;
