-- gendurable schema version 20: a claimed row's inbox read in a snapshot taken after its lock
-- (docs/design.md §2, "A claim's inbox"). A statement that claims a row — the pick, the key
-- hand-off, an outcome that chains the row's next step — reads the row's unconsumed signals in
-- its own snapshot, taken before it locked the row. A signal that committed in between (its
-- transaction held the row while the claim waited for it, or committed just before the claim
-- locked the row) is in the locked row's inbox counts, but not in that snapshot: the step ran
-- without it, and its outcome consumed it unseen. The claiming statements now compare the list
-- with the counts, and where the list is short read it again through this function: a volatile
-- function takes a fresh snapshot for its query, and the row is locked by then, so every signal
-- the counts include has committed. p_skip: signals the calling statement itself consumes (its
-- own writes are not in that snapshot). One probe of the signals' inbox index, only for a row
-- whose claim raced a signal.
CREATE OR REPLACE FUNCTION {{schema}}.gendurable_inbox_fresh(p_id bigint, p_skip bigint[]) RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RETURN (SELECT jsonb_agg(jsonb_build_object('id', s.id, 'name', s.name, 'payload', s.payload,
                                              'at', s.inserted_at) ORDER BY s.id)
          FROM {{schema}}.gendurable_signals AS s
          WHERE s.target_id = p_id AND s.consumed_at IS NULL AND s.id <> ALL (p_skip));
END
$$;
