-- gendurable schema version 8: autovacuum of the instances table by its dead rows, not its size.
-- Every step writes its row again (a job leaves two dead row versions: its claim's and its
-- outcome's; status moves between partial indexes, so no update can be HOT), while finished rows
-- stay in the table for the whole retention (7 days by default). PostgreSQL's default starts
-- autovacuum once dead rows pass 20% of the table: on a table holding days of history that is
-- millions of dead rows between runs. Here it starts once 10,000 rows are dead, whatever the
-- table's size — about once per autovacuum_naptime (1 min by default) under a steady load.
-- Measured in BENCHMARKS.md ("Long horizon — storage experiments"): 3-4× fewer dead tuples, no
-- latency cost we could tell from the load. It replaces per-table values an operator may have
-- given these two parameters (the server's other autovacuum settings still apply).
ALTER TABLE {{schema}}.gendurable_instances
  SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
