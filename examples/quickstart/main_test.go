package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/pgtemp"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// serverAndBinary starts a private PostgreSQL (the schema name is fixed:
// each test needs its own server), connects to it, and builds the
// quickstart.
func serverAndBinary(t *testing.T) (*pgtemp.Server, *pgxpool.Pool, string) {
	t.Helper()
	srv, err := pgtemp.Start(t.Context(), pgtemp.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	pool, err := pgxpool.New(t.Context(), srv.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	bin := filepath.Join(t.TempDir(), "quickstart")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return srv, pool, bin
}

// TestByHandCommandsShareTheDemosSchema follows the README's "see a crash
// recovered, by hand" and then its "crash recovery, shown": insert (and
// work, status) create the quickstart schema marked as the demo's own, so
// the demo run afterwards resets it instead of refusing it; and, like the
// demo, they refuse a quickstart schema that someone else created, leaving
// it as it was. Before, insert installed gendurable's tables in any schema
// named quickstart, unmarked, and the demo then refused its own leftovers.
// Its own server: the schema name is fixed.
func TestByHandCommandsShareTheDemosSchema(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL")
	}
	ctx := t.Context()
	srv, pool, bin := serverAndBinary(t)
	quickstart := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+srv.URL())
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	out2, err := quickstart("insert", "-n", "3")
	require.NoError(t, err, out2)
	require.Contains(t, out2, "inserted 3 orders and 3 jobs")
	comment := func() string {
		var c *string
		require.NoError(t, pool.QueryRow(ctx, `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = 'quickstart'`).Scan(&c))
		require.NotNil(t, c, "the schema carries a mark")
		return *c
	}
	require.Contains(t, comment(), "created by gendurable quickstart")
	out2, err = quickstart("insert", "-n", "2") // a second insert keeps the first's instances
	require.NoError(t, err, out2)
	out2, err = quickstart("status")
	require.NoError(t, err, out2)
	require.Contains(t, out2, "runnable    10 ")

	out2, err = quickstart("demo", "-n", "3") // resets the by-hand leftovers: its own schema
	require.NoError(t, err, out2)
	require.Contains(t, out2, "every instance finished")

	// Ctrl-C in the middle: one line naming the signal, not "context canceled".
	cmd := exec.CommandContext(ctx, bin, "demo", "-n", "3000")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+srv.URL())
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "kill -9 worker 1") {
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	require.Error(t, cmd.Wait())
	require.Equal(t, "quickstart: stopped: interrupt signal received\n", errOut.String())

	// The interrupted demo's workers were killed (SIGKILL) as it exited; a
	// statement one of them had under way may still run on the server for a
	// moment, and deadlock with the DROP: the DROP is then tried again.
	for i := 0; ; i++ {
		_, err = pool.Exec(ctx, `DROP SCHEMA quickstart CASCADE; CREATE SCHEMA quickstart; CREATE TABLE quickstart.mine (x int)`)
		var pgErr *pgconn.PgError
		if i < 20 && errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		require.NoError(t, err)
		break
	}
	for _, args := range [][]string{{"insert", "-n", "1"}, {"status"}, {"work"}, {"demo", "-n", "1"}} {
		out2, err = quickstart(args...)
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%q: %s", args, out2)
		require.Equal(t, 2, exit.ExitCode(), "%q: exit 2, as gendurable demo's refusal", args)
		require.Contains(t, out2, `"quickstart" holds an object that gendurable did not create (table quickstart.mine)`, "%q", args)
		require.Contains(t, out2, "unset DATABASE_URL to run the quickstart", "%q", args)
		require.Contains(t, out2, "move them out of schema quickstart", "%q", args)
		require.NotContains(t, out2, "CASCADE", "%q: no drop advised of a schema holding someone's table", args)
		require.NotContains(t, out2, "--reset-schema", "%q: a flag quickstart does not have", args)
		require.Equal(t, 1, strings.Count(strings.TrimSpace(out2), "\n")+1, "%q: one line: %s", args, out2)
	}
	var tables []string
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'quickstart'`)
	require.NoError(t, err)
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"mine"}, tables, "someone else's schema is left as it was")
}

// TestOrdersOutOfRangeAreRefused: -n outside 1..100000 is refused before
// anything runs (exit 2). Before, a negative -n panicked, 0 printed a kill
// and a recovery that had not happened, and 10 million ran the machine out
// of memory building one InsertMany.
func TestOrdersOutOfRangeAreRefused(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "quickstart")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, args := range [][]string{{"-n", "-1"}, {"-n", "0"}, {"insert", "-n", "0"}, {"insert", "-n", "100001"}, {"demo", "-n", "10000000"}} {
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://127.0.0.1:1/none") // never reached
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%v: %s", args, out)
		require.Equal(t, 2, exit.ExitCode(), "%v: %s", args, out)
		require.Contains(t, string(out), "-n must be within 1..100000", "%v", args)
	}
	// An unknown command is a usage error too (it was exit 1).
	cmd := exec.CommandContext(t.Context(), bin, "bogus")
	cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://127.0.0.1:1/none")
	out, err = cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 2, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), `unknown command "bogus"`)
}

// TestAStoppedDemoStopsItsWorkersCleanly: the demo stopped (SIGTERM, or
// Ctrl-C) before its kill stops its worker processes with SIGTERM, so they
// finish or give back what they hold: no instance is left executing. The
// workers were started with exec.CommandContext, whose cancel is a SIGKILL:
// a newcomer's Ctrl-C left 40 rows executing until their leases ran out.
func TestAStoppedDemoStopsItsWorkersCleanly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL")
	}
	ctx := t.Context()
	srv, pool, bin := serverAndBinary(t)

	// The demo kills worker 1 a second in: a run whose stop came after
	// that (a slow machine) shows nothing, and is run again.
	var executing int
	for try := 1; ; try++ {
		cmd := exec.CommandContext(ctx, bin, "-n", "2000")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+srv.URL())
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		lines := bufio.NewScanner(stdout)
		for lines.Scan() && !strings.HasPrefix(lines.Text(), "started worker 2") {
		}
		require.Eventually(t, func() bool {
			return pool.QueryRow(ctx, `SELECT count(*) FROM quickstart.gendurable_instances WHERE status = 'executing'`).Scan(&executing) == nil && executing > 0
		}, 10*time.Second, 5*time.Millisecond, "the workers claim rows")
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		rest, _ := io.ReadAll(stdout)
		_ = cmd.Wait()
		if strings.Contains(string(rest), "kill -9") && try < 5 {
			t.Logf("try %d: the demo's kill came before the stop; again", try)
			continue
		}
		require.NotContains(t, string(rest), "kill -9", "five tries, each stopped after the demo's kill")
		break
	}
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM quickstart.gendurable_instances WHERE status = 'executing'`).Scan(&executing))
	require.Zero(t, executing, "the workers stopped cleanly: nothing left executing")
}

// TestAKilledDemoTakesItsWorkersAlong: the demo killed outright (kill -9,
// the OOM killer) stops its worker processes too, through a parent-death
// SIGTERM. Before, they went on running, orphaned, polling the throwaway
// server that died with the demo, until someone found and killed them (a
// newcomer's probe: still there 17 minutes later).
func TestAKilledDemoTakesItsWorkersAlong(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL")
	}
	srv, _, bin := serverAndBinary(t)
	cmd := exec.CommandContext(t.Context(), bin, "-n", "20000")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+srv.URL())
	// A file, not a pipe: a pipe's reader goes with the demo, and a worker
	// writing to it then would die of SIGPIPE, fix or no fix.
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	require.NoError(t, err)
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	var pids []int
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(out.Name())
		pids = pids[:0]
		for _, line := range strings.Split(string(b), "\n") {
			var n, pid int
			if _, err := fmt.Sscanf(line, "started worker %d (pid %d)", &n, &pid); err == nil {
				pids = append(pids, pid)
			}
		}
		return len(pids) == 2
	}, 60*time.Second, 20*time.Millisecond, "the demo starts two workers")
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	for _, pid := range pids {
		require.Eventually(t, func() bool { return !running(pid) }, 30*time.Second, 50*time.Millisecond,
			"worker pid %d outlived the killed demo", pid)
	}
}

// running reports whether process pid exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z'
}
