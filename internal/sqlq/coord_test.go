package sqlq_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
)

// beforeRetryStatement is a pgx tracer that runs hook (once) just before
// Retry's second statement is sent: after its lock statement returned.
type beforeRetryStatement struct {
	once sync.Once
	hook func()
}

func (b *beforeRetryStatement) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "k.kids") && b.hook != nil {
		b.once.Do(b.hook)
	}
	return ctx
}

func (b *beforeRetryStatement) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestRetryRacingACancelKeepsTheJoinCount: a Retry of a parent that is live
// when Retry locks, cancelled just after (before Retry's second statement),
// while a child's outcome holds the parent's row. The retry used to run on
// the row it had not locked: it counted the parent's live children on its
// snapshot (2), waited for the child's outcome, and wrote that count over
// the child's decrement, leaving the parent awaiting 2 children with 1 live
// — it would never wake. Now the retry statement retries only a row the lock
// statement locked, and Retry locks again when the row turned failed in
// between (waiting for the child's outcome, then counting on a snapshot
// that holds it).
func TestRetryRacingACancelKeepsTheJoinCount(t *testing.T) {
	t.Parallel()
	tr := &beforeRetryStatement{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 5, Tracer: tr})
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	ctx := context.Background()
	s := `"` + schema + `"`
	var parent, c1 int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, status, children_total, children_pending)
		VALUES ('m', 'a', 'awaiting_children', 2, 2) RETURNING id`).Scan(&parent))
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, parent_id, parent_fanout)
		VALUES ('m', 'a', $1, 0) RETURNING id`, parent).Scan(&c1))
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, parent_id, parent_fanout) VALUES ('m', 'a', $1, 0)`, parent)
	require.NoError(t, err)

	cancelled := make(chan error, 1)
	var childTx pgx.Tx
	var childDone sync.WaitGroup
	tr.hook = func() {
		go func() {
			_, _, err := q.Cancel(ctx, pool, parent, "operator")
			cancelled <- err
		}()
		select {
		case err := <-cancelled:
			// The cancel did not wait for Retry: the race is open. A child's
			// outcome now holds the parent's row (as parentJoinCTE does)
			// and commits once Retry's statement waits for it.
			cancelled <- err
			// (The hook runs on the test's goroutine, inside Retry.)
			var err2 error
			childTx, err2 = pool.Begin(ctx)
			require.NoError(t, err2)
			_, err2 = childTx.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET status = 'done', finished_at = now() WHERE id = $1`, c1)
			require.NoError(t, err2)
			_, err2 = childTx.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET children_pending = children_pending - 1 WHERE id = $1`, parent)
			require.NoError(t, err2)
			childDone.Add(1)
			go func() {
				defer childDone.Done()
				deadline := time.Now().Add(5 * time.Second)
				for time.Now().Before(deadline) {
					var waiting int
					_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting)
					if waiting > 0 {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				_ = childTx.Commit(ctx)
			}()
		case <-time.After(500 * time.Millisecond):
			// The cancel waits for Retry's lock.
		}
	}
	_, _, _, err = q.Retry(ctx, pool, parent)
	require.NoError(t, err)
	childDone.Wait()
	require.NoError(t, <-cancelled)

	var status string
	var pending, live int
	require.NoError(t, pool.QueryRow(ctx, `SELECT p.status::text, p.children_pending,
		(SELECT count(*) FROM `+s+`.gendurable_instances AS c WHERE c.parent_id = p.id AND c.status NOT IN ('done', 'failed'))
		FROM `+s+`.gendurable_instances AS p WHERE p.id = $1`, parent).Scan(&status, &pending, &live))
	// Retried after the child's outcome, awaiting its one live child.
	require.Equal(t, "awaiting_children", status)
	require.Equal(t, live, pending, "a parent awaiting its children counts the live ones")
	require.Equal(t, 1, live)
}
