#!/bin/sh
# bench-buffers.sh URL GENDURABLE WORKLOAD N: the shared buffers (hit + read) and the statement
# time the server spent per step of one `bench --workload WORKLOAD -n N` run, from
# pg_stat_statements (the server must load it: shared_preload_libraries = pg_stat_statements).
# Top-level statements only, and only the run's own work: the bench's set-up (the filler rows it
# inserts first, ANALYZE, DDL and the migrations, its catalog checks) is left out. Buffers are a steadier measure
# than steps/s on a shared machine: they count work, not time. Resets pg_stat_statements.
# After the totals, the statements that cost most, one per line: buffers per step, calls, rows
# and the start of the statement's text (nested statements too, toplevel f: a plpgsql function's
# own statements, such as the hand-off's claim, are counted there and inside their caller).
# Example:
#   bench/scripts/bench-buffers.sh postgres://postgres@127.0.0.1:5461/postgres /tmp/gd partition 20000
set -eu
[ $# -eq 4 ] || { echo "usage: $0 URL GENDURABLE WORKLOAD N" >&2; exit 2; }
url=$1 gd=$2 workload=$3 n=$4
psql -X -q -At "$url" -c 'SET client_min_messages = warning' -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements' -c 'SELECT pg_stat_statements_reset()' >/dev/null
"$gd" bench --database-url "$url" --workload "$workload" -n "$n" --concurrency 1000 --min-demand 1000 --json >/dev/null
psql -X -At -F ' ' "$url" -v n="$n" <<'SQL'
SELECT round(sum(shared_blks_hit + shared_blks_read) / :n, 1) AS buffers_per_step,
       round(sum(total_exec_time)::numeric * 1000 / :n, 1) AS statement_us_per_step
FROM pg_stat_statements
WHERE toplevel AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query !~ '^INSERT INTO \S+\.gendurable_instances \(fsm, step, status, finished_at\)'
  AND regexp_replace(query, '^(\s*--[^\n]*\n)+', '') !~* '^\s*(ANALYZE|CREATE|DROP|TRUNCATE|ALTER|COMMENT|SET|BEGIN|COMMIT|ROLLBACK)'
  AND query !~ '(obj_description|string_agg\(x\.what|pg_namespace|pg_catalog)';
SELECT round((shared_blks_hit + shared_blks_read)::numeric / :n, 1) AS buffers_per_step,
       calls, rows, CASE WHEN toplevel THEN 't' ELSE 'f' END AS toplevel,
       left(regexp_replace(query, '\s+', ' ', 'g'), 100) AS statement
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query !~ '^INSERT INTO \S+\.gendurable_instances \(fsm, step, status, finished_at\)'
  AND regexp_replace(query, '^(\s*--[^\n]*\n)+', '') !~* '^\s*(ANALYZE|CREATE|DROP|TRUNCATE|ALTER|COMMENT|SET|BEGIN|COMMIT|ROLLBACK)'
  AND query !~ '(obj_description|string_agg\(x\.what|pg_namespace|pg_catalog)'
ORDER BY shared_blks_hit + shared_blks_read DESC
LIMIT 8;
SQL
