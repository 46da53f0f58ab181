-- Back to version 18: a statement sent again after its answer was lost no longer finds what the
-- lost attempt wrote.
ALTER TABLE {{schema}}.gendurable_instances DROP COLUMN IF EXISTS chain_token;
ALTER TABLE {{schema}}.gendurable_instances DROP COLUMN IF EXISTS outcome_token;
