-- gendurable schema version 19: an outcome statement whose answer was lost is recognised when it
-- is sent again (docs/design.md §6, "A lost answer"). Each outcome statement writes, on every row
-- whose fence held, the claim token of the outcome it wrote (outcome_token) and, for a chained
-- step, the claim token it drew for that step (chain_token; NULL otherwise). A statement sent
-- again after a connection lost its answer finds its outcomes fenced out (the row has moved on);
-- the committer then looks for its tokens there: a row whose outcome_token is the outcome's was
-- written by the lost attempt, and a chained step whose claim_token is still chain_token is the
-- worker's to run. Before, the chained step was left executing with nobody running it until its
-- lease ran out, and the reaper charged it an attempt it never had: with MaxAttempts 1 the
-- instance failed at a step that never ran. Tokens are drawn once each from the claim sequence,
-- so a token names one claim: a pick, a reaper or an operator that moved the row on leaves a
-- claim_token that is not chain_token. Two nullable columns without defaults: no rewrite, no scan.
ALTER TABLE {{schema}}.gendurable_instances ADD COLUMN IF NOT EXISTS outcome_token bigint;
ALTER TABLE {{schema}}.gendurable_instances ADD COLUMN IF NOT EXISTS chain_token bigint;
