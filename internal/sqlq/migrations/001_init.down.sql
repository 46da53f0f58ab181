-- Reverts schema version 1: drops everything gendurable created.
DROP TABLE IF EXISTS {{schema}}.gendurable_signals;
DROP TABLE IF EXISTS {{schema}}.gendurable_instances;
DROP SEQUENCE IF EXISTS {{schema}}.gendurable_claim_token_seq;
DROP TYPE IF EXISTS {{schema}}.gendurable_status;
