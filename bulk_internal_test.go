package gendurable

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
)

// TestBulkStatementEndsWithinTheGraceOfItsDeadline: a bulk statement under
// way when its call's deadline passes is let finish for BulkStatementGrace
// (here shortened), not for the 30 s of a call without a deadline. A
// hostile-operator probe held a row lock against a dashboard's cancel by
// filter: the request's last statement waited 30 s past the request's 10 s,
// and the client got an empty reply from the server's 30 s write timeout
// for changes that were made.
func TestBulkStatementEndsWithinTheGraceOfItsDeadline(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 3})
	e, err := New(pool, &Config{Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	e.bulkGrace = 300 * time.Millisecond
	ctx := context.Background()
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step, queue)
		VALUES ('m', 'a', 'q') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM "`+schema+`".gendurable_instances WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := e.CancelMany(dctx, []int64{id}, "probe")
	took := time.Since(start)
	t.Logf("CancelMany blocked by a row lock returned after %s: %v, %+v", took.Round(time.Millisecond), err, res)
	if err == nil {
		t.Fatal("CancelMany of a locked row returned no error")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v: want the statement's deadline", err)
	}
	// 0.2 s + 0.3 s of grace; 30 s without the bound.
	if took > 10*time.Second {
		t.Errorf("the statement ran %s: past its deadline and grace", took)
	}
	if res.Changed != 0 {
		t.Errorf("changed %d: the cancelled statement changed nothing", res.Changed)
	}
}
