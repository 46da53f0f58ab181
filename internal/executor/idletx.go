package executor

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// idleClock measures how long a WithTx callback leaves its transaction
// idle: waiting on the callback's own work rather than on a statement.
// The server ends an engine transaction that waits on its client for a
// lease (sqlq.BeginIdleLimited); when the transaction's session is gone,
// the longest idle stretch tells that end — the callback's own doing,
// which running it again would repeat — from a terminated session or a
// failover, which the engine's infrastructure answers for.
type idleClock struct {
	mu      sync.Mutex
	busy    int       // statements (or open result sets) in progress
	lastEnd time.Time // when busy last went to 0
	longest time.Duration
	// firstErr is the first error the server returned to a statement of
	// the callback's: the one that aborted the transaction, should the
	// callback not return it.
	firstErr *pgconn.PgError
}

// note keeps err if it is the first server error of the transaction.
func (c *idleClock) note(err error) {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) {
		return
	}
	c.mu.Lock()
	if c.firstErr == nil {
		c.firstErr = pgErr
	}
	c.mu.Unlock()
}

// first is the first server error noted, or nil.
func (c *idleClock) first() *pgconn.PgError {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.firstErr
}

func newIdleClock() *idleClock { return &idleClock{lastEnd: time.Now()} }

func (c *idleClock) start() {
	c.mu.Lock()
	if c.busy == 0 {
		c.longest = max(c.longest, time.Since(c.lastEnd))
	}
	c.busy++
	c.mu.Unlock()
}

func (c *idleClock) end() {
	c.mu.Lock()
	if c.busy--; c.busy == 0 {
		c.lastEnd = time.Now()
	}
	c.mu.Unlock()
}

// longestIdle is the longest stretch so far with no statement in progress,
// the current one included.
func (c *idleClock) longestIdle() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy == 0 {
		return max(c.longest, time.Since(c.lastEnd))
	}
	return c.longest
}

// clockedTx is the pgx.Tx a WithTx callback gets: the engine's transaction,
// its statements timed by an idleClock. What goes around it (Conn, the
// large-object API) is not timed.
type clockedTx struct {
	pgx.Tx
	c   *idleClock
	top bool // the engine's transaction itself, not a savepoint fn began
}

// ErrTxOwned is what a WithTx callback gets when it commits or rolls back
// the transaction it was given: the engine commits it, with the outcome. A
// savepoint the callback began (tx.Begin) it commits and rolls back itself.
var ErrTxOwned = errors.New("gendurable: a WithTx callback must not commit or roll back its transaction: " +
	"the engine commits it with the outcome (for a part that may fail alone, use a savepoint: tx.Begin)")

func (t *clockedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	t.c.start()
	defer t.c.end()
	inner, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &clockedTx{Tx: inner, c: t.c}, nil
}

func (t *clockedTx) Commit(ctx context.Context) error {
	if t.top {
		return ErrTxOwned
	}
	t.c.start()
	defer t.c.end()
	return t.Tx.Commit(ctx)
}

func (t *clockedTx) Rollback(ctx context.Context) error {
	if t.top {
		return ErrTxOwned
	}
	t.c.start()
	defer t.c.end()
	return t.Tx.Rollback(ctx)
}

func (t *clockedTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	t.c.start()
	defer t.c.end()
	return t.Tx.CopyFrom(ctx, table, cols, src)
}

func (t *clockedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	t.c.start()
	defer t.c.end()
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *clockedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.c.start()
	defer t.c.end()
	tag, err := t.Tx.Exec(ctx, sql, args...)
	t.c.note(err)
	return tag, err
}

func (t *clockedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.c.start()
	defer t.c.end()
	rows, err := t.Tx.Query(ctx, sql, args...)
	if err != nil {
		t.c.note(err)
		return rows, err
	}
	return &clockedRows{Rows: rows, c: t.c}, nil
}

func (t *clockedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	t.c.start()
	defer t.c.end()
	return &clockedRow{row: t.Tx.QueryRow(ctx, sql, args...), c: t.c}
}

func (t *clockedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.c.start()
	defer t.c.end()
	return &clockedBatch{BatchResults: t.Tx.SendBatch(ctx, b), c: t.c}
}

// clockedRows times the calls that read its result set, not the time it
// stays open: the server sends a result set that fits its socket's buffers
// at once and then waits on the client, idle, however slowly the callback
// reads it — work of the callback's own between two rows is idle. (A result
// set too large for the buffers keeps the server writing, not idle, while
// the callback reads slowly; a stretch of 0.9 × TxIdle between two rows of
// one is taken for idle all the same.)
type clockedRows struct {
	pgx.Rows
	c *idleClock
}

func (r *clockedRows) Next() bool {
	r.c.start()
	defer r.c.end()
	return r.Rows.Next()
}

func (r *clockedRows) Close() {
	r.c.start()
	defer r.c.end()
	r.Rows.Close()
	r.c.note(r.Rows.Err())
}

func (r *clockedRows) Err() error {
	err := r.Rows.Err()
	r.c.note(err)
	return err
}

type clockedRow struct {
	row pgx.Row
	c   *idleClock
}

func (r *clockedRow) Scan(dest ...any) error {
	r.c.start()
	defer r.c.end()
	err := r.row.Scan(dest...)
	r.c.note(err)
	return err
}

// clockedBatch times the calls that read the batch's results, as
// clockedRows does a result set's.
type clockedBatch struct {
	pgx.BatchResults
	c *idleClock
}

func (b *clockedBatch) Exec() (pgconn.CommandTag, error) {
	b.c.start()
	defer b.c.end()
	return b.BatchResults.Exec()
}

func (b *clockedBatch) Query() (pgx.Rows, error) {
	b.c.start()
	defer b.c.end()
	rows, err := b.BatchResults.Query()
	if err != nil {
		return rows, err
	}
	return &clockedRows{Rows: rows, c: b.c}, nil
}

func (b *clockedBatch) QueryRow() pgx.Row {
	b.c.start()
	defer b.c.end()
	return &clockedRow{row: b.BatchResults.QueryRow(), c: b.c}
}

func (b *clockedBatch) Close() error {
	b.c.start()
	defer b.c.end()
	return b.BatchResults.Close()
}
