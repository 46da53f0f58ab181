-- gendurable schema version 22: the pick and the key hand-off run their statements on generic
-- plans (docs/design.md §4, "Plans"). A PL/pgSQL function prepares each of its statements once
-- per connection, and PostgreSQL's plan cache tries custom plans first: one planned for each
-- call's values. Where the generic plan's estimate is no better than the custom ones' (the
-- statements that read the pick's arrays of keys, whose length a custom plan knows), it keeps
-- planning every call. pg_stat_statements (track_planning on, workload keys) counted one plan per
-- call for five statements of these two functions: 4.7 ms of planning in a pick of 10.6 ms, and
-- 1.2 ms in a hand-off of 2.6. Their plans do not depend on the values: every statement reads
-- by key, by id or by the pick indexes' order, under LIMITs; the plan tests check the generic
-- ones. Same functions otherwise (no body is replaced).
ALTER FUNCTION {{schema}}.gendurable_pick(text, int, bigint, text, text[], int[], double precision[], int[], int,
                                        int, timestamptz, smallint[])
  SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION {{schema}}.gendurable_handoff(text[], text[], int[], bigint[], bigint[], bigint)
  SET plan_cache_mode = force_generic_plan;
