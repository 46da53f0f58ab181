package gendurable_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestWithTxIdleTimeoutBeyondTheServersRange: the server takes
// idle_in_transaction_session_timeout in milliseconds up to 2^31-1 (about
// 24.8 days). A longer Config.TxIdleTimeout must still let WithTx steps
// run, not make every BEGIN fail.
func TestWithTxIdleTimeoutBeyondTheServersRange(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[orderArgs]{
		Name: "farlimit", Start: "pay",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "SELECT 1")
					return err
				}), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.TxIdleTimeout = 30 * 24 * time.Hour
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(orderArgs{}))
	r := b.waitStatus(id, "done", 20*time.Second)
	require.Equal(t, 0, r.Attempt, "%v", r.Errors)
}

// blockingSource is a COPY source that sends one row, then waits.
type blockingSource struct {
	sent    bool
	release chan struct{}
	started chan struct{}
}

func (s *blockingSource) Next() bool {
	if !s.sent {
		s.sent = true
		return true
	}
	close(s.started)
	<-s.release
	return false
}
func (s *blockingSource) Values() ([]any, error) { return []any{1}, nil }
func (s *blockingSource) Err() error             { return nil }

// TestIdleLimitDoesNotEndACopyCutOff documents a limit of the idle limit: a
// client cut off in the middle of a COPY FROM STDIN leaves its session
// waiting on the client inside a statement (state active, ClientRead), not
// idle in transaction, so idle_in_transaction_session_timeout never ends
// it: it holds its locks until the server's TCP keepalive gives up.
func TestIdleLimitDoesNotEndACopyCutOff(t *testing.T) {
	t.Parallel()
	b := setup(t, fastConfig(""))
	ctx := context.Background()
	b.exec(`CREATE TABLE {{s}}.sink (n int)`)
	proxy := dbtest.NewCutProxyFor(t, dbtest.URL())
	conn, err := pgx.ConnectConfig(ctx, proxy.PoolConfig(t, dbtest.URL()).ConnConfig)
	require.NoError(t, err)
	require.Equal(t, proxy.Addr(), conn.PgConn().Conn().RemoteAddr().String(), "through the proxy")
	pid := conn.PgConn().PID()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: sqlq.BeginIdleLimited(300 * time.Millisecond)})
	require.NoError(t, err)
	src := &blockingSource{release: make(chan struct{}), started: make(chan struct{})}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = tx.CopyFrom(ctx, pgx.Identifier{b.schema, "sink"}, []string{"n"}, src)
	}()
	<-src.started
	// The server is in the COPY, waiting for the client's data, before the cut.
	require.Eventually(t, func() bool {
		var state, query string
		err := b.pool.QueryRow(ctx, `SELECT state, query FROM pg_stat_activity WHERE pid = $1`, int(pid)).Scan(&state, &query)
		return err == nil && state == "active" && strings.HasPrefix(strings.ToLower(query), "copy")
	}, 5*time.Second, 10*time.Millisecond, "the server never entered the COPY")
	proxy.Cut()
	time.Sleep(2 * time.Second) // more than six times the limit
	var state string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE pid = $1`, int(pid)).Scan(&state))
	require.Equal(t, "active", state, "the session is still there, in its COPY, after 2 s")
	_, _ = b.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int(pid))
	proxy.Close()
	close(src.release)
	<-copied
	_ = conn.Close(ctx)
}

// TestTxIdleTimeoutDefaultAndNone: Engine.Config reports TxIdleTimeout,
// the lease by default; with a negative one a WithTx transaction has the
// server's own setting (0 here: none); with a positive one, that, in whole
// ms.
func TestTxIdleTimeoutDefaultAndNone(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		set  time.Duration
		want string
	}{{0, "3s"}, {-1, "0"}, {1500 * time.Microsecond, "1ms"}} {
		got := make(chan string, 1)
		m := &gendurable.Machine[orderArgs]{
			Name: "limitof", Start: "pay",
			Steps: map[string]gendurable.StepFunc[orderArgs]{
				"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
					return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
						var s string
						err := tx.QueryRow(ctx, "SELECT current_setting('idle_in_transaction_session_timeout')").Scan(&s)
						if err == nil {
							select {
							case got <- s:
							default:
							}
						}
						return err
					}), nil
				},
			},
		}
		cfg := fastConfig("", m)
		cfg.TxIdleTimeout = c.set
		b := setup(t, cfg)
		if c.set == 0 {
			require.Equal(t, b.eng.Config().LeaseDuration, b.eng.Config().TxIdleTimeout)
		} else {
			require.Equal(t, c.set, b.eng.Config().TxIdleTimeout)
		}
		b.start()
		b.insert(m.New(orderArgs{}))
		select {
		case s := <-got:
			require.Equal(t, c.want, s, "TxIdleTimeout %s", c.set)
		case <-time.After(20 * time.Second):
			t.Fatal("the step never ran")
		}
	}
}
