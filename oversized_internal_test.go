package gendurable

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
)

// oversizedCounter is a pgx tracer that counts statements, and those that
// look for rows too large to claim.
type oversizedCounter struct{ all, looks atomic.Int64 }

func (c *oversizedCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.all.Add(1)
	if strings.Contains(d.SQL, "kid_bytes") {
		c.looks.Add(1)
	}
	return ctx
}

func (c *oversizedCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestFailOversizedBatchesAndBacksOff: failOversized fails every row too
// large to claim that it finds in one statement (before: one cancel per
// row, 1 + 3 statements for three rows), each with its own sizes in its
// reason; and when a look finds nothing (or fails), the picks that keep
// failing do not run it again at once (before: a look after every failed
// pick, however often).
func TestFailOversizedBatchesAndBacksOff(t *testing.T) {
	t.Parallel()
	counter := &oversizedCounter{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Tracer: counter})
	e, err := New(pool, &Config{Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	e.oversized.limit = 1000 // bytes: three rows of a few kB of signals are "too large"
	ctx := context.Background()
	s := `"` + schema + `"`
	var ids []int64
	for i := range 3 {
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, queue, inbox)
			VALUES ('m', 'a', 'big', '{"note": 1}') RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_signals (target_id, name, payload)
			VALUES ($1, 'note', to_jsonb(repeat('x', $2::int)))`, id, 2000*(i+1)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// A row of the queue that is small enough stays as it is.
	var small int64
	if err := pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, queue)
		VALUES ('m', 'a', 'big') RETURNING id`).Scan(&small); err != nil {
		t.Fatal(err)
	}

	before := counter.all.Load()
	e.failOversized("big")
	if n := counter.all.Load() - before; n != 2 {
		t.Errorf("failOversized of three rows sent %d statements; want 2 (the look, one cancel)", n)
	}
	for i, id := range ids {
		var status, reason string
		var left int
		if err := pool.QueryRow(ctx, `SELECT status::text, errors -> -1 ->> 'error',
			(SELECT count(*) FROM `+s+`.gendurable_signals WHERE target_id = i.id AND consumed_at IS NULL)
			FROM `+s+`.gendurable_instances AS i WHERE id = $1`, id).Scan(&status, &reason, &left); err != nil {
			t.Fatal(err)
		}
		if status != "failed" || !strings.Contains(reason, "too large to claim") || left != 0 {
			t.Errorf("row %d: %s, %q, %d signals unconsumed", id, status, reason, left)
		}
		if want := []string{"2134", "4134", "6134"}[i]; !strings.Contains(reason, "unconsumed signals to "+want) {
			t.Errorf("row %d: reason %q does not give its own size (%s)", id, reason, want)
		}
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status::text FROM `+s+`.gendurable_instances WHERE id = $1`, small).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "runnable" {
		t.Errorf("the small row is %s", status)
	}

	// Nothing left to fail: the first look finds nothing, and the picks
	// that keep failing do not look again until its backoff has passed.
	looks := counter.looks.Load()
	for range 20 {
		e.failOversized("big")
	}
	if n := counter.looks.Load() - looks; n != 1 {
		t.Errorf("20 failed picks that found nothing to fail looked %d times; want 1", n)
	}
	if wait := time.Until(e.oversized.next["big"]); wait <= 0 || wait > oversizedBackoffMin {
		t.Errorf("next look in %s; want within %s", wait, oversizedBackoffMin)
	}
	// The backoff doubles, bounded; a look that fails rows resets it.
	now := time.Now()
	for range 10 {
		e.oversized.done("big", false, now)
	}
	if wait := e.oversized.next["big"].Sub(now); wait != oversizedBackoffMax {
		t.Errorf("after 11 looks that failed nothing the next waits %s; want %s", wait, oversizedBackoffMax)
	}
	e.oversized.done("big", true, now)
	if !e.oversized.due("big", now) {
		t.Error("a look that failed rows left a backoff")
	}
}
