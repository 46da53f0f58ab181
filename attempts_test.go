package gendurable_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestReapedRowKeepsItsPlaceInTheBacklog: a reaped row goes back to
// runnable with its original eligible_at, so it runs before the rows that
// became eligible after it, not after the whole backlog.
func TestReapedRowKeepsItsPlaceInTheBacklog(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []int64
	job := &gendurable.Job[orderArgs]{
		Name: "backlog",
		Perform: func(_ context.Context, j *gendurable.Run[orderArgs]) error {
			mu.Lock()
			order = append(order, j.ID)
			mu.Unlock()
			return nil
		},
	}
	cfg := fastConfig("", job)
	cfg.ReaperInterval = -1
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: -1, PollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	reaped := b.insert(job.New(orderArgs{}))
	var backlog []int64
	for range 5 {
		backlog = append(backlog, b.insert(job.New(orderArgs{})))
	}
	// The first row became eligible an hour ago and was claimed by a worker
	// that died; the backlog became eligible a minute ago.
	b.exec(`UPDATE {{s}}.gendurable_instances SET eligible_at = now() - interval '1 minute' WHERE id <> $1`, reaped)
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'executing', eligible_at = now() - interval '1 hour',
	          claim_token = nextval('{{s}}.gendurable_claim_token_seq'), lease_expires_at = now() - interval '1 second'
	        WHERE id = $1`, reaped)
	before := b.row(reaped).EligibleAt

	n, err := b.eng.Reap(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	r := b.row(reaped)
	require.Equal(t, "runnable", r.Status)
	require.Equal(t, 1, r.Attempt)
	require.WithinDuration(t, before, r.EligibleAt, time.Millisecond, "the reap moved the row's eligible_at")

	b.start()
	for _, id := range backlog {
		b.waitStatus(id, "done", 20*time.Second)
	}
	b.waitStatus(reaped, "done", 20*time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, reaped, order[0], "the reaped row ran after the backlog: %v", order)
}

// TestWithTxWaitingOnALockKeepsItsClaim: a WithTx transaction waits for
// three leases on a row another transaction holds — in its callback (a
// contended row of the application), or in the outcome statement (the
// instance row itself, as an open SignalTx holds it). Its worker is alive and
// its claim is heartbeated (or, while locked, cannot be reaped), so the
// transaction must not be given up after one lease (the step would be
// reaped and run again with attempt + 1): it commits once the lock is
// released, on the first attempt.
func TestWithTxWaitingOnALockKeepsItsClaim(t *testing.T) {
	t.Parallel()
	for _, lockInstance := range []bool{false, true} {
		name := "callback waits on an application row"
		if lockInstance {
			name = "outcome waits on the instance row"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int32
			var schema string
			waiting, proceed := make(chan struct{}, 10), make(chan struct{})
			m := &gendurable.Machine[orderArgs]{
				Name: "contended", Start: "pay",
				Steps: map[string]gendurable.StepFunc[orderArgs]{
					"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
						runs.Add(1)
						return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
							waiting <- struct{}{}
							<-proceed
							_, err := tx.Exec(ctx, "UPDATE "+schema+".contended SET n = n + 1 WHERE id = 1")
							return err
						}), nil
					},
				},
			}
			cfg := fastConfig("", m)
			cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 300*time.Millisecond, 100*time.Millisecond
			b := setup(t, cfg)
			schema = b.schema
			b.exec(`CREATE TABLE {{s}}.contended (id int PRIMARY KEY, n int NOT NULL)`)
			b.exec(`INSERT INTO {{s}}.contended VALUES (1, 0)`)
			b.start()
			id := b.insert(m.New(orderArgs{}))
			select {
			case <-waiting:
			case <-time.After(20 * time.Second):
				t.Fatal("the step never ran")
			}

			ctx := context.Background()
			holder, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(ctx) }()
			lock, args := `UPDATE {{s}}.contended SET n = n + 100 WHERE id = 1`, []any(nil)
			if lockInstance {
				lock, args = `SELECT 1 FROM {{s}}.gendurable_instances WHERE id = $1 FOR UPDATE`, []any{id}
			}
			_, err = holder.Exec(ctx, replaceSchema(lock, b.schema), args...)
			require.NoError(t, err)
			close(proceed)
			time.Sleep(3 * time.Second) // three leases
			require.NoError(t, holder.Rollback(ctx))

			r := b.waitStatus(id, "done", 20*time.Second)
			require.Equal(t, 0, r.Attempt, "the waiting transaction was given up and the step reaped: %v", r.Errors)
			require.Empty(t, r.Errors)
			require.Equal(t, int32(1), runs.Load(), "the step ran again")
			require.Equal(t, 1, b.count(`SELECT n FROM {{s}}.contended WHERE id = 1`))
		})
	}
}

// TestWithTxConnectionFailureCostsNoAttempt: the backend of a WithTx
// transaction is terminated (pg_terminate_backend, as an administrator or a
// failover would) while its callback runs. That is no failure of the step:
// with MaxAttempts 1 the instance must not fail; the step runs again without
// counting an attempt, and the error history and the StepEvent say
// "infrastructure".
func TestWithTxConnectionFailureCostsNoAttempt(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	var b *testBundle
	m := &gendurable.Machine[orderArgs]{
		Name: "terminated", Start: "pay",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				n := runs.Add(1)
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					if n > 1 {
						return nil
					}
					var pid int
					if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
						return err
					}
					if _, err := b.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
						return err
					}
					for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
						var alive bool
						if err := b.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive); err != nil {
							return err
						}
						if !alive {
							break
						}
					}
					_, err := tx.Exec(ctx, "SELECT 1")
					return err
				}), nil
			},
		},
	}
	events := &eventLog{}
	cfg := fastConfig("", m)
	cfg.Hooks = []gendurable.Hook{events}
	b = setup(t, cfg)
	b.start()
	res, err := b.eng.Insert(context.Background(), m.New(orderArgs{}).With(gendurable.InsertOpts{MaxAttempts: 1}))
	require.NoError(t, err)

	eventually(t, 20*time.Second, func() bool { return gendurable.Status(b.row(res.ID).Status).Terminal() }, "instance not finished")
	r := b.row(res.ID)
	require.Equal(t, "done", r.Status, "errors: %v", r.Errors)
	require.Equal(t, 0, r.Attempt)
	require.Equal(t, int32(2), runs.Load())
	require.Len(t, r.Errors, 1)
	require.Equal(t, "infrastructure", r.Errors[0]["kind"], "%v", r.Errors)
	ev, ok := findEvent(events, func(e *gendurable.StepEvent) bool { return e.InstanceID == res.ID && e.Err != nil })
	require.True(t, ok, "no StepEvent with the error")
	require.True(t, errors.Is(ev.Err, gendurable.ErrInfrastructure), "StepEvent.Err = %v", ev.Err)
	require.Equal(t, "replay", ev.Outcome)
}

// TestWithTxOnASilentlyDeadConnectionRunsAgain: the server session of a
// WithTx transaction ends while its connection, seen from the client, just
// goes quiet (half-open, as after a failover): no error ever arrives. The
// claim is heartbeated on other connections, so only a check of the session
// itself can tell: the step must run again, without counting an attempt,
// instead of waiting forever.
func TestWithTxOnASilentlyDeadConnectionRunsAgain(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	var admin *pgxpool.Pool
	m := &gendurable.Machine[orderArgs]{
		Name: "halfopen", Start: "pay",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				n := runs.Add(1)
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					if n > 1 {
						return nil
					}
					pid := tx.Conn().PgConn().PID()
					tx.Conn().PgConn().Conn().(*quietConn).silence()
					if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", int64(pid)); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "SELECT 1") // no answer, ever
					return err
				}), nil
			},
		},
	}
	admin, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Extra: 8})
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	pcfg.MaxConns = 8
	dialer := &net.Dialer{}
	pcfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &quietConn{Conn: c}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := fastConfig(schema, m)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 300*time.Millisecond, 100*time.Millisecond
	cfg.Logger = testLogger(t)
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	b := &testBundle{t: t, pool: admin, schema: schema, eng: eng}
	b.start()
	res, err := eng.Insert(context.Background(), m.New(orderArgs{}).With(gendurable.InsertOpts{MaxAttempts: 1}))
	require.NoError(t, err)

	r := b.waitStatus(res.ID, "done", 15*time.Second)
	require.Equal(t, 0, r.Attempt)
	require.Equal(t, int32(2), runs.Load())
	require.Len(t, r.Errors, 1)
	require.Equal(t, "infrastructure", r.Errors[0]["kind"], "%v", r.Errors)
}

// quietConn is a connection that can be silenced: from then on writes are
// swallowed and reads wait for their deadline (or Close), as on a TCP
// connection whose peer vanished without a word.
type quietConn struct {
	net.Conn
	mu       sync.Mutex
	quiet    bool
	closed   bool
	deadline time.Time
}

func (c *quietConn) silence() {
	c.mu.Lock()
	c.quiet = true
	c.mu.Unlock()
}

func (c *quietConn) state() (quiet, closed bool, deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.quiet, c.closed, c.deadline
}

func (c *quietConn) Read(p []byte) (int, error) {
	if quiet, _, _ := c.state(); !quiet {
		return c.Conn.Read(p)
	}
	for {
		_, closed, deadline := c.state()
		switch {
		case closed:
			return 0, net.ErrClosed
		case !deadline.IsZero() && time.Now().After(deadline):
			return 0, os.ErrDeadlineExceeded
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *quietConn) Write(p []byte) (int, error) {
	if quiet, closed, _ := c.state(); quiet {
		if closed {
			return 0, net.ErrClosed
		}
		if len(p) > 0 && p[0] == 'X' { // Terminate: the pool gives the connection up; don't keep it waiting
			c.mu.Lock()
			c.closed = true
			c.mu.Unlock()
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *quietConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *quietConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *quietConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return c.Conn.Close()
}
