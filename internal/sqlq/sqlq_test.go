package sqlq

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestErrAttrsCarryThePoolerAdvice: an engine started behind PgBouncer in
// transaction pooling with pgx's default statement cache passes Start
// when its statements happen not to collide, then every pick and sweep
// fails with "prepared statement ... already exists": their log lines now
// carry the advice Start would have given.
func TestErrAttrsCarryThePoolerAdvice(t *testing.T) {
	clash := fmt.Errorf("pick: %w", &pgconn.PgError{Code: "42P05", Message: `prepared statement "stmtcache_1" already exists`})
	require.Equal(t, []any{"err", clash, "advice", PoolerHint}, ErrAttrs(clash))
	gone := &pgconn.PgError{Code: "26000", Message: `prepared statement "stmtcache_2" does not exist`}
	require.Equal(t, []any{"err", gone, "advice", PoolerHint}, ErrAttrs(gone))
	// pgx's describe_exec mode: the execute's bind met another client's
	// unnamed statement, or none (a PgBouncer probe: Start failed with the
	// first, without the advice).
	for _, e := range []*pgconn.PgError{
		{Code: "08P01", Message: `bind message supplies 1 parameters, but prepared statement "" requires 3`},
		{Code: "08P01", Message: `bind message has 1 result formats but query has 2 columns`},
		{Code: "26000", Message: `unnamed prepared statement does not exist`},
	} {
		require.Equal(t, []any{"err", e, "advice", PoolerHint}, ErrAttrs(e), e.Message)
	}
	// Nor is such a clash a failed connection: the server refused the
	// statement (the CLI called it connection_lost).
	bind := fmt.Errorf("queue counts: %w", &pgconn.PgError{Code: "08P01", Message: `bind message supplies 0 parameters, but prepared statement "" requires 10`})
	require.False(t, ConnectionFailure(bind))
	require.False(t, ConnectionRefusal(bind))
	require.True(t, ConnectionRefusal(&pgconn.PgError{Code: "08P01", Message: "query_wait_timeout"}))
	// Other protocol violations are not the pooler's.
	require.False(t, PreparedStatementClash(&pgconn.PgError{Code: "08P01", Message: "invalid frontend message type 0"}))
	require.False(t, PreparedStatementClash(&pgconn.PgError{Code: "08P01", Message: "query_wait_timeout"}))
	plain := errors.New("connection refused")
	require.Equal(t, []any{"err", plain}, ErrAttrs(plain))
	// A schema moved under a running engine (an upgrade probe).
	missing := fmt.Errorf("pick: %w", &pgconn.PgError{Code: "42703", Message: `column h.unconfirmed_freed does not exist`})
	require.Equal(t, []any{"err", missing, "advice", SchemaChangedHint}, ErrAttrs(missing))
}

// TestCatalogRaceIsOnlyACacheLookupThatFailed: a migration (and a scratch
// schema's drop) tries again on PostgreSQL's internal error for a catalog
// entry another transaction dropped under its reads — it failed a full
// test run's drop of one schema while others' were dropped beside it — and
// on no other internal error.
func TestCatalogRaceIsOnlyACacheLookupThatFailed(t *testing.T) {
	race := fmt.Errorf("migrate: %w", &pgconn.PgError{Code: "XX000", Message: "cache lookup failed for relation 100387"})
	require.True(t, CatalogRace(race))
	require.False(t, CatalogRace(&pgconn.PgError{Code: "XX000", Message: "could not read block 0 in file"}))
	require.False(t, CatalogRace(&pgconn.PgError{Code: "42P01", Message: "cache lookup failed"}))
	require.False(t, CatalogRace(errors.New("cache lookup failed for relation 1")))
	require.False(t, CatalogRace(nil))
}

// TestAFileErrorIsNoConnectionFailure: the syscall.Errno of a file's error
// (or a rename's, a kill's) is a net.Error; a stat of the demo's server binaries that failed was
// read as a connection lost mid-command (a newcomer's probe). A network
// error (one a connect or a read on a connection gave) still is one.
func TestAFileErrorIsNoConnectionFailure(t *testing.T) {
	_, statErr := os.Stat("/nonexistent/initdb")
	require.False(t, ConnectionFailure(fmt.Errorf("pgtemp: %w", statErr)))
	require.False(t, ConnectionFailure(fmt.Errorf("pgtemp: %w", os.Mkdir("/nonexistent/x", 0o700))))
	require.False(t, ConnectionFailure(fmt.Errorf("pgtemp: %w", os.Rename("/nonexistent/a", "/nonexistent/b"))))
	require.False(t, ConnectionFailure(fmt.Errorf("pgtemp: stop: %w", syscall.Kill(1<<30, 0))))
	_, dialErr := net.Dial("tcp", "127.0.0.1:1")
	require.Error(t, dialErr)
	require.True(t, ConnectionFailure(fmt.Errorf("read: %w", dialErr)))
	require.True(t, ConnectionFailure(fmt.Errorf("read: %w", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET})))
	// Nor is a listen of this process's own (a port in use).
	require.False(t, ConnectionFailure(fmt.Errorf("--addr: %w", &net.OpError{Op: "listen", Net: "tcp", Err: syscall.EADDRINUSE})))
}
