//go:build linux

package pgbouncer

import (
	"context"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// connect opens one client connection through the pooler, in a mode that
// PgBouncer 1.18 supports in transaction pooling.
func connect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestBouncerMultiplexes: many clients' transactions share at most
// PoolSize server sessions, and the admin console answers.
func TestBouncerMultiplexes(t *testing.T) {
	ctx := testCtx(t)
	b := StartWith(t, dbtest.URL(), Options{PoolSize: 2})
	const clients = 8
	var mu sync.Mutex
	pids := map[uint32]bool{}
	var wg sync.WaitGroup
	for range clients {
		conn := connect(t, ctx, b.URL)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				var pid uint32
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "SELECT pg_sleep($1::float8)", 0.01)
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				pids[pid] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.NotEmpty(t, pids)
	require.LessOrEqual(t, len(pids), 2, "server sessions used by %d clients", clients)

	acfg, err := pgx.ParseConfig(b.URL)
	require.NoError(t, err)
	acfg.Database = "pgbouncer"
	acfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // the console speaks no extended protocol
	aconn, err := pgx.ConnectConfig(ctx, acfg)
	require.NoError(t, err)
	defer aconn.Close(ctx)
	rows, err := aconn.Query(ctx, "SHOW CONFIG")
	require.NoError(t, err)
	conf := map[string]string{}
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		if k, ok := vals[0].(string); ok {
			v, _ := vals[1].(string)
			conf[k] = v
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, "transaction", conf["pool_mode"])
	require.Equal(t, "2", conf["default_pool_size"])
}

// TestBouncerLeaksSessionState: the pooler really pools transactions and
// does not reset server sessions between clients — what one client SETs
// for its session another sees — so the tests that run through it catch
// session state.
func TestBouncerLeaksSessionState(t *testing.T) {
	ctx := testCtx(t)
	url := StartWith(t, dbtest.URL(), Options{PoolSize: 1}).URL
	a, c := connect(t, ctx, url), connect(t, ctx, url)
	_, err := a.Exec(ctx, "SET gendurable.bouncer_probe = 'leaked'")
	require.NoError(t, err)
	var got string
	require.NoError(t, c.QueryRow(ctx, "SELECT current_setting('gendurable.bouncer_probe', true)").Scan(&got))
	require.Equal(t, "leaked", got)
}

// TestBouncerStopsWithTest: the pooler is gone (its port closed, its
// directory removed) once the test that started it has ended.
func TestBouncerStopsWithTest(t *testing.T) {
	var port int
	var dir string
	t.Run("inner", func(t *testing.T) {
		b := StartWith(t, dbtest.URL(), Options{})
		port = b.Port
		dir = b.p.Cmd.Dir
		conn, err := net.Dial("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		require.NoError(t, err)
		_ = conn.Close()
		if os.Geteuid() == 0 {
			st, err := os.Stat(dir)
			require.NoError(t, err)
			require.NotZero(t, st.Sys().(*syscall.Stat_t).Uid, "pgbouncer's directory belongs to the unprivileged user")
			require.NotZero(t, b.p.Cmd.SysProcAttr.Credential.Uid)
		}
	})
	_, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), time.Second)
	require.Error(t, err, "port %d still open", port)
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestBouncerBadUpstream: an unreachable server is a startup error that
// quotes pgbouncer's log, not a hang.
func TestBouncerBadUpstream(t *testing.T) {
	bin, err := FindBinary()
	if err != nil {
		t.Skip(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	_, err = launch(t, bin, "postgres://postgres@127.0.0.1:"+strconv.Itoa(dead)+"/test", Options{StartTimeout: 2 * time.Second})
	require.Error(t, err)
	require.Contains(t, err.Error(), "no working connection")
}

func TestBouncerClientURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "postgres://postgres@127.0.0.1:7000/test?sslmode=disable"},
		{"postgresql://u:p%40ss@db.example:6543/app?sslmode=require&application_name=x", "postgresql://u:p%40ss@127.0.0.1:7000/app?application_name=x&sslmode=disable"},
		{"host=localhost port=5433 user=bob dbname=shop", "postgres://bob@127.0.0.1:7000/shop?sslmode=disable"},
	} {
		up, err := parseUpstream(tc.in)
		require.NoError(t, err)
		got, err := clientURL(tc.in, up, 7000)
		require.NoError(t, err)
		require.Equal(t, tc.want, got, tc.in)
	}
}

func TestBouncerRenderRejectsReserved(t *testing.T) {
	up := &upstream{host: "127.0.0.1", port: 5432, user: "postgres"}
	_, err := render(t.TempDir(), up, 7000, nil, Options{Settings: map[string]string{"listen_port": "1"}})
	require.ErrorContains(t, err, "controlled by the helper")
	_, err = render(t.TempDir(), up, 7000, nil, Options{Settings: map[string]string{"x": "a\nb"}})
	require.ErrorContains(t, err, "invalid setting")
	ini, err := render(t.TempDir(), up, 7000, nil, Options{PoolSize: 3, Settings: map[string]string{"Query_Wait_Timeout": "5"}})
	require.NoError(t, err)
	b, err := os.ReadFile(ini)
	require.NoError(t, err)
	for _, line := range []string{"pool_mode = transaction", "default_pool_size = 3", "query_wait_timeout = 5", "listen_port = 7000", "auth_type = trust"} {
		require.Contains(t, string(b), line+"\n")
	}
}
