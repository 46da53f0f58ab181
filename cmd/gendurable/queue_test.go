package main

import (
	"context"
	"testing"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/stretchr/testify/require"
)

// TestCLIPauseRefusesUnknownQueues: `pause nosuchqueue` and `resume $'\t'`
// exit 3 and leave no phantom queue; --create makes one on purpose, and
// `queue remove` deletes it again, refusing a queue that has instances.
func TestCLIPauseRefusesUnknownQueues(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	s := []string{"--schema", schema}
	queues := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_queues`).Scan(&n))
		return n
	}

	_, errOut, code := cli(t, append([]string{"pause", "nosuchqueue"}, s...)...)
	require.Equal(t, exitNotFound, code, errOut)
	require.Contains(t, errOut, "unknown queue")
	require.Contains(t, errOut, "--create")
	_, _, code = cli(t, append([]string{"resume", "\t"}, s...)...)
	require.Equal(t, exitUsage, code, "a control character is invalid input")
	require.Equal(t, 0, queues())
	out, _, code := cli(t, append([]string{"status"}, s...)...)
	require.Equal(t, 0, code)
	require.NotContains(t, out, "nosuchqueue")

	out, errOut, code = cli(t, append([]string{"pause", "later", "--create"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "queue later paused")
	_, _, code = cli(t, append([]string{"resume", "later"}, s...)...)
	require.Equal(t, 0, code, "known from its row")

	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, queue, step) VALUES ('m', 'busy', 'a')`)
	require.NoError(t, err)
	_, errOut, code = cli(t, append([]string{"pause", "busy"}, s...)...)
	require.Equal(t, 0, code, "known from its instance: %s", errOut)
	_, errOut, code = cli(t, append([]string{"queue", "remove", "busy"}, s...)...)
	require.Equal(t, exitConflict, code, errOut)
	require.Contains(t, errOut, "queue has instances")

	out, errOut, code = cli(t, append([]string{"queue", "remove", "later", "--json"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"queue": "later", "removed": true}`, out)
	_, _, code = cli(t, append([]string{"queue", "remove", "later"}, s...)...)
	require.Equal(t, exitNotFound, code)
	_, _, code = cli(t, append([]string{"queue", "frobnicate", "x"}, s...)...)
	require.Equal(t, exitUsage, code)
	_, errOut, code = cli(t, append([]string{"queue", "remove", "\xff"}, s...)...)
	require.Equal(t, exitUsage, code, "invalid UTF-8 is invalid input, not a database error: %s", errOut)
	require.NotContains(t, errOut, "SQLSTATE")
	require.Equal(t, 1, queues(), "busy keeps its row")
}
