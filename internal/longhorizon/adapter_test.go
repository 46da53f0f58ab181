package longhorizon

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSchemaFromEnv(t *testing.T) {
	t.Parallel()
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "X_SCHEMA" {
				return v
			}
			return ""
		}
	}
	for v, want := range map[string]string{"": "", "  ": "", " bench_1 ": "bench_1", "_x": "_x"} {
		got, err := SchemaFromEnv(env(v), "X_SCHEMA")
		require.NoError(t, err, "%q", v)
		require.Equal(t, want, got)
	}
	for _, v := range []string{"a;b", "1abc", "a-b", "é", string(make([]byte, 64))} {
		_, err := SchemaFromEnv(env(v), "X_SCHEMA")
		require.ErrorIs(t, err, ErrInvalidEnv, "%q", v)
		require.ErrorContains(t, err, "X_SCHEMA")
	}
}

func TestPoolConfig(t *testing.T) {
	t.Parallel()
	p, err := PoolConfig(Config{DatabaseURL: "postgres://u@h/db"}, 12)
	require.NoError(t, err)
	require.Equal(t, int32(12), p.MaxConns)
	p, err = PoolConfig(Config{DatabaseURL: "postgres://u@h/db?pool_max_conns=3"}, 12)
	require.NoError(t, err)
	require.Equal(t, int32(3), p.MaxConns, "the URL's setting wins")
	require.Equal(t, 10*time.Second, p.ConnConfig.ConnectTimeout, "a server that never answers is an error, not a hang")
	p, err = PoolConfig(Config{DatabaseURL: "postgres://u@h/db?connect_timeout=2"}, 12)
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, p.ConnConfig.ConnectTimeout, "the URL's setting wins")
	_, err = PoolConfig(Config{DatabaseURL: "postgres://u@h/db?pool_max_conns=x"}, 12)
	require.ErrorIs(t, err, ErrInvalidEnv)
}

func TestWork(t *testing.T) {
	t.Parallel()
	tel := &Telemetry{}
	start := time.Now()
	require.NoError(t, tel.Work(context.Background(), start, 20*time.Millisecond))
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, tel.Work(ctx, time.Now(), time.Hour), context.Canceled)
	require.NoError(t, tel.Work(ctx, time.Now(), 0))
}

func TestExit(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	live := context.Background()
	ended, cancel := context.WithCancel(live)
	cancel()
	require.Equal(t, boom, Exit(live, boom))
	require.NoError(t, Exit(ended, boom), "a stop while starting")
	require.ErrorIs(t, Exit(ended, ErrInvalidEnv), ErrInvalidEnv)
	require.NoError(t, Exit(live, nil))
}
