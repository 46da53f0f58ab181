-- Back to version 9's gendurable_pick alone (its ten-argument overload was left in place by 11).
DROP FUNCTION IF EXISTS {{schema}}.gendurable_pick(text, int, bigint, text, text[], int[], double precision[], int[], int,
  int, timestamptz, smallint[]);
