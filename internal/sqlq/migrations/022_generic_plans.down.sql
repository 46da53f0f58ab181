-- Back to version 21: the pick and the hand-off plan as the plan cache chooses.
ALTER FUNCTION {{schema}}.gendurable_pick(text, int, bigint, text, text[], int[], double precision[], int[], int,
                                        int, timestamptz, smallint[])
  RESET plan_cache_mode;
ALTER FUNCTION {{schema}}.gendurable_handoff(text[], text[], int[], bigint[], bigint[], bigint)
  RESET plan_cache_mode;
