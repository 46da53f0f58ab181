#!/bin/bash
# One storage experiment of BENCHMARKS.md ("Long horizon — storage experiments"):
#
#   bench/scripts/long-horizon-storage.sh LABEL HOLD SECONDS "SETUP SQL"
#
# A fresh database lhx on ADMIN_URL's server; gendurable's migrations; SETUP SQL (the candidate,
# e.g. "ALTER TABLE gendurable_instances SET (fillfactor = 80)"); 1,000,000 finished rows, VACUUM
# ANALYZE (the history a table keeps over its retention, about 80 min at 200 jobs/s); then
# `gendurable bench --long-horizon` at 200 jobs/s, 8 workers, 1 ms jobs for SECONDS, while another
# connection holds a transaction with an xid (BEGIN; SELECT txid_current(); pg_sleep) — for the
# whole run (HOLD=1), its first half (HOLD=2, then recovery) or not at all (HOLD=0). Every 10 s it
# records the table's live and dead tuples, updates and HOT updates, autovacuum runs, table and
# index sizes and the load average; the adapter's lines go to OUT/adapter.jsonl.
# GENDURABLE is the gendurable binary (go build -o /tmp/gendurable ./cmd/gendurable).
set -u
LABEL=$1; HOLD=$2; DUR=$3; SETUP=${4:-}
ADMIN=${ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
DB=${ADMIN%%/postgres\?*}/lhx?sslmode=disable
GENDURABLE=${GENDURABLE:-/tmp/gendurable}
OUT=${OUT_DIR:-/tmp/lh-storage}/$LABEL-h$HOLD; mkdir -p "$OUT"
psql -q "$ADMIN" -c 'DROP DATABASE IF EXISTS lhx' -c 'CREATE DATABASE lhx'
"$GENDURABLE" migrate up --database-url "$DB" >/dev/null
[ -n "$SETUP" ] && psql -q "$DB" -c "$SETUP"
psql -q "$DB" -c "INSERT INTO gendurable_instances (fsm, queue, step, state, status, finished_at)
  SELECT 'long_horizon_job', 'long_horizon', 'perform', jsonb_build_object('seq', g, 'pad', repeat('x', 224)), 'done', now()
  FROM generate_series(1, 1000000) g" -c 'VACUUM ANALYZE gendurable_instances'
psql -q "$DB" -c 'SELECT pg_stat_reset()' >/dev/null
HPID=
if [ "$HOLD" = 1 ]; then
  psql -q "$DB" -c 'BEGIN' -c 'SELECT txid_current()' -c "SELECT pg_sleep($DUR + 5)" >/dev/null 2>&1 & HPID=$!
elif [ "$HOLD" = 2 ]; then
  psql -q "$DB" -c 'BEGIN' -c 'SELECT txid_current()' -c "SELECT pg_sleep($DUR / 2)" >/dev/null 2>&1 & HPID=$!
  date -u +%s -d "+$((DUR / 2)) seconds" > "$OUT/released_at"
fi
sleep 1
DATABASE_URL="$DB" PRODUCER_RATE=200 WORKER_COUNT=8 SAMPLE_EVERY_S=5 "$GENDURABLE" bench --long-horizon \
  >"$OUT/adapter.jsonl" 2>"$OUT/adapter.log" & APID=$!
: > "$OUT/stats.tsv"
for ((i = 0; i < DUR; i += 10)); do
  sleep 10
  psql -At -F $'\t' "$DB" -c "SELECT extract(epoch FROM now())::int, n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd,
      autovacuum_count, pg_table_size('gendurable_instances'), pg_indexes_size('gendurable_instances'),
      '$(cut -d' ' -f1 /proc/loadavg)' FROM pg_stat_user_tables WHERE relname = 'gendurable_instances'" >> "$OUT/stats.tsv"
done
kill -TERM $APID; wait $APID; echo "adapter exit $?" >> "$OUT/adapter.log"
[ -n "$HPID" ] && kill $HPID 2>/dev/null; wait 2>/dev/null
echo "$OUT"
