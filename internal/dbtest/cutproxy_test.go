package dbtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestCutProxyStrand: a connection open when Strand is called gets no reply
// any more (and is not closed: only its own deadline ends the wait), while a
// connection opened after it works.
func TestCutProxyStrand(t *testing.T) {
	t.Parallel()
	proxy := NewCutProxyFor(t, URL())
	cfg := proxy.PoolConfig(t, URL()).ConnConfig
	ctx := context.Background()
	connect := func() *pgx.Conn {
		c, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(ctx) })
		return c
	}
	old := connect()
	var one int
	require.NoError(t, old.QueryRow(ctx, "SELECT 1").Scan(&one))

	proxy.Strand()
	fresh := connect()
	require.NoError(t, fresh.QueryRow(ctx, "SELECT 1").Scan(&one), "a connection opened after Strand")
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := old.QueryRow(qctx, "SELECT 1").Scan(&one)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the stranded connection")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "ended by its deadline, not by a close")
	require.NoError(t, fresh.QueryRow(ctx, "SELECT 1").Scan(&one), "the fresh connection still works")
	proxy.Close() // first: pgx closing the stranded connection would wait for the server's goodbye
}
