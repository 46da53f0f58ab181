package maintenance

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/jackc/pgx/v5"
)

const insertFinished = `INSERT INTO {{s}}.gendurable_instances (fsm, step, status, finished_at)
VALUES ('m', 'a', $1, now() - $2::bigint * interval '1 second') RETURNING id`

// TestPrunerDeletesOldFinishedRows: the running pruner deletes done and
// failed rows that finished before the retention, with their signals, and
// keeps recent and live rows.
func TestPrunerDeletesOldFinishedRows(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	oldDone := d.id(insertFinished, "done", 7200)
	d.id(insertFinished, "failed", 7200)
	recent := d.id(insertFinished, "done", 60)
	live := d.id(`INSERT INTO {{s}}.gendurable_instances (fsm, step, inserted_at) VALUES ('m', 'a', now() - interval '1 day') RETURNING id`)
	d.id(`INSERT INTO {{s}}.gendurable_signals (target_id, name) VALUES ($1, 'go') RETURNING id`, oldDone)
	d.id(`INSERT INTO {{s}}.gendurable_signals (target_id, name) VALUES ($1, 'go') RETURNING id`, recent)

	p := &Pruner{Queries: d.q, DB: d.pool, Interval: 20 * time.Millisecond, Retention: time.Hour, Log: quiet}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	eventually(t, 3*time.Second, func() bool {
		return d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`) == 2
	}, "old finished rows not pruned")
	p.Stop()
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id IN ($1, $2)`, recent, live); n != 2 {
		t.Fatal("a recent or live row was pruned")
	}
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1`, oldDone); n != 0 {
		t.Fatal("the pruned row's signal is left")
	}
	if n := d.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1`, recent); n != 1 {
		t.Fatal("a kept row's signal was pruned")
	}
}

// TestPrunerRunOnceBatches: one sweep deletes batch after batch, reporting
// the running total after each.
func TestPrunerRunOnceBatches(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	for range 5 {
		d.id(insertFinished, "done", 7200)
	}
	var progress []int64
	p := &Pruner{Queries: d.q, DB: d.pool, Batch: 2, Log: quiet}
	n, err := p.RunOnce(context.Background(), time.Hour, func(total int64) { progress = append(progress, total) })
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 || !slices.Equal(progress, []int64{2, 4, 5}) {
		t.Fatalf("pruned %d with progress %v, want 5 with [2 4 5]", n, progress)
	}
}

// TestPrunerRunOnceStartsEachBatchWhereTheLastEnded: while another session
// holds an xid, the finished index keeps the entries of every row a sweep
// deleted, unmarked. A sweep whose every batch started at the index's head
// read them all again each batch (47,270 entries for these 43 batches of 50,
// in one run); each batch now starts at the last one's finished_at, so the
// sweep reads each entry about once (2,310). A group of rows finished at the
// same instant, larger than a batch, is deleted whole.
func TestPrunerRunOnceStartsEachBatchWhereTheLastEnded(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	ctx := context.Background()
	const spread, tied, batch = 2000, 120, 50
	if _, err := d.pool.Exec(ctx, d.sql(`INSERT INTO {{s}}.gendurable_instances (fsm, step, status, finished_at)
		SELECT 'm', 'a', 'done'::{{s}}.gendurable_status, now() - interval '2 hours' + g * interval '1 millisecond' FROM generate_series(1, $1::int) g
		UNION ALL SELECT 'm', 'a', 'failed'::{{s}}.gendurable_status, now() - interval '3 hours' FROM generate_series(1, $2::int)`), spread, tied); err != nil {
		t.Fatal(err)
	}
	holder, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dbtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	// The sweep's own backend reports what it read.
	reads := func() int64 {
		t.Helper()
		n, _ := dbtest.IndexReads(t, conn, d.q.Schema, "gendurable_instances_finished")
		return n
	}
	before := reads()
	p := &Pruner{Queries: d.q, DB: conn, Batch: batch, Log: quiet}
	n, err := p.RunOnce(ctx, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	read := reads() - before
	t.Logf("deleted %d, read %d index entries", n, read)
	if n != spread+tied {
		t.Fatalf("deleted %d, want %d", n, spread+tied)
	}
	if limit := int64(3 * (spread + tied)); read > limit {
		t.Fatalf("the sweep read %d entries of the finished index for %d rows, want at most %d", read, n, limit)
	}
}

// TestPrunerAbandonsABatchOnADeadConnection: between two prunes, the
// pruner's connection is stranded (nothing crosses it, nothing is closed).
// The next batch never gets a reply; at BatchTimeout the pruner abandons it
// and logs a warning, and the prune an Interval later, on a fresh
// connection, deletes the row that finished meanwhile.
func TestPrunerAbandonsABatchOnADeadConnection(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	pool, proxy := d.proxied()
	logs := &syncbuf.Buffer{}
	d.id(insertFinished, "done", 7200)
	p := &Pruner{Queries: d.q, DB: pool, Interval: strandedSweepInterval, Retention: time.Hour,
		BatchTimeout: strandedSweepTimeout, Log: bufLogger(logs)}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	none := func() bool { return d.count(`SELECT count(*) FROM {{s}}.gendurable_instances`) == 0 }
	eventually(t, 5*time.Second, none, "row finished before the strand not pruned")

	proxy.Strand()
	stranded := time.Now()
	d.id(insertFinished, "done", 7200)
	eventually(t, 10*time.Second, none, "row finished after the strand not pruned")
	recoveredAfterDeadline(t, time.Since(stranded))
	if !strings.Contains(logs.String(), "prune failed") {
		t.Fatalf("no warning of the abandoned batch; logs:\n%s", logs.String())
	}
}
