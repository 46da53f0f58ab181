package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/stretchr/testify/require"
)

// TestUIRefusesAShortPasswordBeyondLoopback: beyond loopback a bearer token
// had to be 16 bytes or more, but a basic-auth password of any length was
// served — and failed logins are only logged (5 lines a minute per IP),
// never slowed: against `ui --basic-auth ops:2345` a client on the same
// host tried 12,092 passwords in 3 s (4,031 a second) and found it, with
// 5 lines in the log. Beyond loopback the password must now be 16 bytes
// or more too (exit 2, nothing served), whether a token is given as well
// or not (either credential lets a client in).
func TestUIRefusesAShortPasswordBeyondLoopback(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1})
	dir := t.TempDir()
	short := filepath.Join(dir, "basic")
	require.NoError(t, os.WriteFile(short, []byte("ops:2345\n"), 0o600))
	for _, args := range [][]string{
		{"--basic-auth-file", short},
		{"--basic-auth-file", short, "--token", "a-long-enough-token-0123"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		cmd := exec.CommandContext(ctx, binary, append([]string{"ui", "--schema", schema, "--addr", "0.0.0.0:0"}, args...)...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL())
		out, err := cmd.CombinedOutput()
		cancel()
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "%v: %v %s", args, err, out)
		require.Equal(t, exitUsage, ee.ExitCode(), "%v: served instead of refusing: %s", args, out)
		require.Contains(t, string(out), "password of at least 16 bytes")
	}
}
