package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// TestUIChecksTheDatabaseOnItsPool: ui checks the database before it
// serves (TestConnectionFailuresAreOneReadableLine) by pinging the pool
// the dashboard then uses, so the connection the check opened serves the
// pages. Before, the check opened a connection of its own beside the
// pool's and closed it, and the first page opened another: two
// connections, counted here by a proxy in front of the server, where one
// does.
func TestUIChecksTheDatabaseOnItsPool(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1})
	u, err := url.Parse(dbtest.URL())
	require.NoError(t, err)
	proxy := newCountingProxy(t, u.Host)
	u.Host = proxy.addr
	q := u.Query()
	q.Set("sslmode", "disable") // one TCP connection per database connection
	u.RawQuery = q.Encode()

	addr, stderr := startUI(t, []string{"DATABASE_URL=" + u.String()}, "--schema", schema)
	for _, page := range []string{"/", "/instances", "/machines"} {
		require.Equal(t, http.StatusOK, call(t, "GET", addr+page, "", ""), "%s: %s", page, stderr)
	}
	require.Equal(t, int64(1), proxy.accepted.Load(), "the check's connection serves the pages")
}

// countingProxy forwards loopback connections to upstream and counts them.
type countingProxy struct {
	addr     string
	accepted atomic.Int64
}

func newCountingProxy(t *testing.T, upstream string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &countingProxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			open = append(open, c, up)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
			wg.Go(func() { _, _ = io.Copy(c, up); c.Close() })
		}
	})
	return p
}

// TestUIWithJSONWritesJSONLines: `ui --json` prints its address as a JSON
// object and writes every stderr line — the dashboard's audit lines, the
// shutdown note — as JSON. Before, the audit logger was always text, so a
// JSON log pipeline broke on (or dropped) the dashboard's audit trail.
func TestUIWithJSONWritesJSONLines(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, nil)
	cmd, stdout, stderr := launchUI(t, nil, "--json", "--schema", schema)
	var first struct{ Dashboard string }
	require.NoError(t, json.NewDecoder(stdout).Decode(&first))
	require.True(t, strings.HasPrefix(first.Dashboard, "http://127.0.0.1:"), "%+v", first)

	// A cross-origin mutation: refused, and audit-logged.
	req, _ := http.NewRequest("POST", first.Dashboard+"queues/q/pause", nil)
	req.Header.Set("Origin", "http://evil.example")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait())
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	require.GreaterOrEqual(t, len(lines), 2, "an audit line and the shutdown note: %s", stderr.String())
	for _, l := range lines {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), "a stderr line that is not JSON: %q", l)
		require.NotEmpty(t, m["msg"], "%q", l)
	}
	require.Contains(t, stderr.String(), "stopping; answering the requests under way first")
}
