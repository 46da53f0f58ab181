-- gendurable schema version 17: the reaper tells a prefetched claim whose step never started from
-- a step that was running (docs/design.md §4, "Prefetched claims"). Each heartbeat writes, beside
-- the lease it extends, the claim token of a row its process holds but has not started yet (NULL
-- once the step started); the reaper returns an expired claim whose token is still marked so to
-- runnable without charging an attempt, once per attempt. Before, a worker killed with claims in
-- its prefetch buffer charged every one of them an attempt, and with MaxAttempts 1 they failed
-- without having run. A nullable column without a default: no rewrite, no scan.
ALTER TABLE {{schema}}.gendurable_instances ADD COLUMN IF NOT EXISTS unstarted_token bigint;
