-- Back to version 9: no key hand-off (engines of version 9 never call it).
DROP FUNCTION IF EXISTS {{schema}}.gendurable_handoff(text[], text[], int[], bigint[], bigint[], bigint);
