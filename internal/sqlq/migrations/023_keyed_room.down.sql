-- Back to version 22: the pick claims keyed rows into the prefetch buffer as well (the
-- twelve-argument pick, left in place by version 23, is the one version 22 calls).
DROP FUNCTION {{schema}}.gendurable_pick(text, int, bigint, text, text[], int[], double precision[], int[], int,
                                        int, timestamptz, smallint[], int);
