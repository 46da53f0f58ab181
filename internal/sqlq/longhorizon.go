package sqlq

import (
	"context"
	"time"
)

// ---------------------------------------------------------------------------
// The long-horizon adapter (`gendurable bench --long-horizon`): what it reads
// besides the hot path — the queue's depth and the database clock.

// queueDepthSQL counts a queue's rows that a pick could claim now — runnable
// and eligible — at most $2 of each kind: plain rows through the plain pick
// index, keyed rows through the keyed one (so neither count scans the table,
// and a backlog costs at most $2 index entries per kind).
const queueDepthSQL = `
SELECT (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.gendurable_instances
         WHERE status = 'runnable' AND partition_key IS NULL AND queue = $1 AND eligible_at <= now()
         LIMIT $2) AS p)
     + (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.gendurable_instances
         WHERE status = 'runnable' AND partition_key IS NOT NULL AND queue = $1 AND eligible_at <= now()
         LIMIT $2) AS k)`

// QueueDepth counts the rows of queue that could be claimed now (runnable,
// eligible), counting at most limit plain and limit keyed rows.
func (q *Queries) QueueDepth(ctx context.Context, db DB, queue string, limit int64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, render(queueDepthSQL, quoteIdent(q.Schema)), queue, limit).Scan(&n)
	return n, err
}

// DBNow reads the database's clock (clock_timestamp(), not the transaction's
// start), for comparing it with the process's.
func DBNow(ctx context.Context, db DB) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
	return t, err
}
