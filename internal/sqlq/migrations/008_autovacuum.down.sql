-- Back to the previous version: autovacuum of the instances table by the server's settings.
ALTER TABLE {{schema}}.gendurable_instances
  RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
