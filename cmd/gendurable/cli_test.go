package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

var binary string

// TestMain builds the real binary once: the CLI is tested end to end.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gendurable-cli")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "gendurable")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		panic(fmt.Sprintf("build: %v\n%s", err, out))
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// cli runs the binary and returns stdout, stderr and the exit code.
func cli(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

type args struct {
	N int `json:"n"`
}

func TestCLIEndToEnd(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	s := []string{"--schema", schema}

	out, _, code := cli(t, append([]string{"migrate", "up"}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, fmt.Sprintf("version 0 → %d", migrate.Latest()))
	out, _, code = cli(t, append([]string{"migrate", "status", "--json"}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, fmt.Sprintf(`"to": %d`, migrate.Latest()))
	out, _, code = cli(t, "migrate", "print", "--schema", "elsewhere")
	require.Equal(t, 0, code)
	require.Contains(t, out, `CREATE TABLE "elsewhere".gendurable_instances`)

	// Instances to operate on, made with the library.
	job := &gendurable.Job[args]{Name: "clijob", MaxAttempts: 1, Perform: func(ctx context.Context, j *gendurable.Run[args]) error {
		if j.State.N == 1 {
			return errors.New("failed on purpose")
		}
		return nil
	}}
	waiter := &gendurable.Machine[args]{Name: "cliwait", Start: "a", Steps: map[string]gendurable.StepFunc[args]{
		"a": func(ctx context.Context, r *gendurable.Run[args]) (gendurable.Outcome, error) {
			return r.Await("b", r.State, "go"), nil
		},
		"b": func(ctx context.Context, r *gendurable.Run[args]) (gendurable.Outcome, error) {
			return gendurable.Done(len(r.Awaited)), nil
		},
	}}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{job, waiter},
		Queues: map[string]gendurable.QueueConfig{"default": {PollInterval: 20 * time.Millisecond}}})
	require.NoError(t, err)
	require.NoError(t, eng.Start(ctx))
	defer func() { _ = eng.Stop(ctx) }()
	failed, err := eng.Insert(ctx, job.New(args{N: 1}))
	require.NoError(t, err)
	waiting, err := eng.Insert(ctx, waiter.New(args{}))
	require.NoError(t, err)
	waitFor := func(id int64, st gendurable.Status) {
		t.Helper()
		for i := 0; ; i++ {
			in, err := eng.Instance(ctx, id)
			require.NoError(t, err)
			if in.Status == st {
				return
			}
			require.Less(t, i, 500, "instance %d stuck at %s", id, in.Status)
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor(failed.ID, gendurable.StatusFailed)
	waitFor(waiting.ID, gendurable.StatusAwaitingSignal)

	out, _, code = cli(t, append([]string{"status"}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "awaiting_signal")
	out, _, code = cli(t, append([]string{"list", "--status", "failed", "--json"}, s...)...)
	require.Equal(t, 0, code)
	var page gendurable.ListPage
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Len(t, page.Instances, 1)
	require.Equal(t, failed.ID, page.Instances[0].ID)
	require.Contains(t, page.Instances[0].LastError, "failed on purpose")

	id := fmt.Sprint(failed.ID)
	out, _, code = cli(t, append([]string{"show", id}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "failed on purpose")
	out, _, code = cli(t, append([]string{"show", "--json", fmt.Sprint(waiting.ID)}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"awaiting signal go"`)

	// retry of a live instance is a conflict; of the failed one it works
	_, errOut, code := cli(t, append([]string{"retry", fmt.Sprint(waiting.ID)}, s...)...)
	require.Equal(t, exitConflict, code, errOut)
	out, _, code = cli(t, append([]string{"retry", id}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "runnable again")
	waitFor(failed.ID, gendurable.StatusFailed) // it fails again: N == 1

	out, _, code = cli(t, append([]string{"signal", fmt.Sprint(waiting.ID), "go", "--payload", `{"ok":true}`}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "woke up")
	waitFor(waiting.ID, gendurable.StatusDone)
	_, _, code = cli(t, append([]string{"signal", fmt.Sprint(waiting.ID), "go"}, s...)...)
	require.Equal(t, exitConflict, code, "a finished instance")
	_, _, code = cli(t, append([]string{"signal", fmt.Sprint(waiting.ID), "go", "--payload", "{nope"}, s...)...)
	require.Equal(t, exitUsage, code)

	another, err := eng.Insert(ctx, waiter.New(args{}))
	require.NoError(t, err)
	// Parked first: a cancel that catches its step running leaves the row's
	// lease live, and prune keeps such a row until the lease ends (60 s), so
	// the prune below found 2 instances, not 3, on a loaded machine.
	waitFor(another.ID, gendurable.StatusAwaitingSignal)
	// A signal sent twice with one dedup key: the second sends nothing,
	// and its log line does not say it was sent.
	for i, want := range []string{"gendurable: signal sent", "gendurable: signal not sent (a duplicate)"} {
		out, errOut, code := cli(t, append([]string{"signal", fmt.Sprint(another.ID), "note", "--dedup-key", "n-1"}, s...)...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, errOut, `msg="`+want+`"`, i)
		require.Equal(t, i == 1, strings.Contains(out, "nothing sent"), out)
	}
	// In JSON, "id" is the signal's and "instance" the instance's.
	jout, jerr, jcode := cli(t, append([]string{"signal", fmt.Sprint(another.ID), "note", "--dedup-key", "n-1", "--json"}, s...)...)
	require.Equal(t, 0, jcode, jerr)
	var sent struct {
		ID, Instance int64
		Duplicate    bool
	}
	require.NoError(t, json.Unmarshal([]byte(jout), &sent), jout)
	require.Equal(t, another.ID, sent.Instance, jout)
	require.True(t, sent.Duplicate, jout)
	require.NotZero(t, sent.ID, jout)
	out, _, code = cli(t, append([]string{"cancel", fmt.Sprint(another.ID), "--reason", "operator said so"}, s...)...)
	require.Equal(t, 0, code, out)
	in, err := eng.Instance(ctx, another.ID)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusFailed, in.Status)
	require.Equal(t, "operator said so", in.Errors[len(in.Errors)-1].Error)

	_, _, code = cli(t, append([]string{"pause", "default"}, s...)...)
	require.Equal(t, 0, code)
	out, _, _ = cli(t, append([]string{"status", "--json"}, s...)...)
	require.Contains(t, out, `"paused": true`)
	_, _, code = cli(t, append([]string{"resume", "default"}, s...)...)
	require.Equal(t, 0, code)

	_, err = pool.Exec(ctx, `UPDATE "`+schema+`".gendurable_instances SET finished_at = now() - interval '30 days' WHERE status IN ('done', 'failed')`)
	require.NoError(t, err)
	out, _, code = cli(t, append([]string{"prune", "--retention", "1000h", "--json"}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"deleted": 0`)
	// A retention under an hour asks first; off a terminal it needs --yes,
	// and deletes nothing without it.
	_, errOut, code = cli(t, append([]string{"prune", "--retention", "0s"}, s...)...)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "pass --yes to confirm")
	out, _, code = cli(t, append([]string{"prune", "--retention", "24h"}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "deleted 3 instances", "the prune without --yes deleted nothing")

	_, _, code = cli(t, append([]string{"show", "999999"}, s...)...)
	require.Equal(t, exitNotFound, code)
	_, _, code = cli(t, append([]string{"show", "abc"}, s...)...)
	require.Equal(t, exitUsage, code)
	_, _, code = cli(t, "frobnicate")
	require.Equal(t, exitUsage, code)
	_, _, code = cli(t, "show")
	require.Equal(t, exitUsage, code)
	_, _, code = cli(t, "status", "--schema", `bad"schema`)
	require.Equal(t, exitUsage, code, "an invalid schema is a usage error")
	out, _, code = cli(t, "help")
	require.Equal(t, 0, code)
	require.True(t, strings.Contains(out, "Exit codes"))
}

// TestDemoOnAThrowawayPostgres runs the README's "run it" command the way a
// newcomer would: no database configured.
func TestDemoOnAThrowawayPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL")
	}
	t.Parallel()
	cmd := exec.Command(binary, "demo", "--orders", "30")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "starting a private throwaway PostgreSQL")
	require.Regexp(t, `done in .*: \d+ checkouts? paid and shipped .*, \d+ timed out waiting for payment`, string(out))
}

// TestDemoWithoutServerBinariesIsNoConnectionLost: a demo that cannot
// start its throwaway server — its binaries not where PGTEMP_BINDIR says —
// says so, exit 1. It was read as a connection lost, with "the connection was lost mid-command: what it
// changed may or may not have been committed; check with show or list"
// (a newcomer's probe): the file error's syscall.Errno is a net.Error.
func TestDemoWithoutServerBinariesIsNoConnectionLost(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ env, want string }{
		{"PGTEMP_BINDIR=/nonexistent", "stat /nonexistent/initdb: no such file or directory"},
	} {
		cmd := exec.Command(binary, "demo", "--orders", "3")
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "TMPDIR=") {
				env = append(env, kv)
			}
		}
		cmd.Env = append(env, c.env)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%s: %s%s", c.env, out.String(), errOut.String())
		require.Equal(t, 1, ee.ExitCode(), "%s: %s", c.env, errOut.String())
		require.Contains(t, errOut.String(), c.want, c.env)
		require.NotContains(t, errOut.String(), "connection was lost", c.env)
		require.NotContains(t, errOut.String(), "committed", c.env)
	}
}

// TestDemoInterruptedSaysSo: Ctrl-C (SIGINT) or SIGTERM in the middle of
// the demo ends it with one line naming the signal, exit 1. Before, it said
// "gendurable: context canceled" (or "queue counts: context canceled").
func TestDemoInterruptedSaysSo(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1, NoMigrate: true, Extra: 4})
	for _, c := range []struct {
		sig  syscall.Signal
		name string
	}{{syscall.SIGINT, "interrupt"}, {syscall.SIGTERM, "terminated"}} {
		cmd := exec.Command(binary, "demo", "--orders", "3000", "--schema", scratchName(t, pool, "gddemo_"))
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL())
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		require.NoError(t, cmd.Start())
		sc := bufio.NewScanner(stdout)
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "inserted ") {
		}
		require.NoError(t, cmd.Process.Signal(c.sig))
		go func() { _, _ = io.Copy(io.Discard, stdout) }()
		err = cmd.Wait()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%s", errOut.String())
		require.Equal(t, exitError, ee.ExitCode(), "%s", errOut.String())
		require.True(t, strings.HasPrefix(errOut.String(), "gendurable: demo stopped: "+c.name+" signal received ("), "%s", errOut.String())
		require.Equal(t, 1, strings.Count(errOut.String(), "\n"), "one line: %s", errOut.String())
	}
}

// TestTheDemoEndsWithTheGoCommandThatRanIt: `go run ./cmd/gendurable demo`
// stopped with SIGTERM (timeout(1), kill, a supervisor) exits without
// passing the signal on; the demo it ran went on, with its throwaway
// PostgreSQL (a newcomer's probe). The
// parent here is a shell named "go" that is killed: the demo must end too,
// saying why.
func TestTheDemoEndsWithTheGoCommandThatRanIt(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1, NoMigrate: true, Extra: 4})
	goCmd := filepath.Join(t.TempDir(), "go")
	sh, err := os.ReadFile("/bin/sh")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(goCmd, sh, 0o755))
	errFile := filepath.Join(t.TempDir(), "stderr")
	parent := exec.Command(goCmd, "-c", `"$0" demo --orders 3000 --schema "$1" 2>"$2" & echo $!; wait`,
		binary, scratchName(t, pool, "gddemo_"), errFile)
	parent.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL())
	stdout, err := parent.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, parent.Start())
	sc := bufio.NewScanner(stdout)
	require.True(t, sc.Scan())
	pid, err := strconv.Atoi(sc.Text())
	require.NoError(t, err)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "inserted ") {
	}
	require.NoError(t, parent.Process.Kill())
	// The demo holds the pipe until it exits: its end is EOF (Wait, which
	// closes the pipe, comes after).
	ended := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, stdout); close(ended) }()
	select {
	case <-ended:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatal("the demo went on running after the go command that ran it ended")
	}
	_ = parent.Wait()
	out, err := os.ReadFile(errFile)
	require.NoError(t, err)
	require.Contains(t, string(out), "demo stopped: the go command that ran it ended")
}

func TestUIServesTheDashboardOnLoopback(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, nil)
	_, errOut, code := cli(t, "ui", "--schema", schema, "--addr", "0.0.0.0:0")
	require.Equal(t, exitUsage, code, "beyond loopback without auth is refused: %s", errOut)
	require.Contains(t, errOut, "needs a bearer token or basic auth: --token-file F, --basic-auth-file F, or GENDURABLE_UI_TOKEN", "it names the ways that keep the secret out of ps")

	url, _ := startUI(t, nil, "--schema", schema, "--token", "s3cret")
	req, _ := http.NewRequest("GET", url+"/", nil)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestUIOnASchemaNeverMigratedExits: `ui --schema` naming a schema with no
// gendurable tables (never migrated, or misspelt) served on, every page a
// 503; it exits 1 at once now, naming the schema, as for one at another
// version.
func TestUIOnASchemaNeverMigratedExits(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "ui", "--schema", schema, "--addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL())
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "ui kept serving: %s", out)
	require.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s", out)
	require.Contains(t, string(out), "has no gendurable tables")
	require.Contains(t, string(out), "first (the database is DATABASE_URL's) (or check --schema: the demo works in gendurable_demo)",
		"the words of every other command, in their order")
}

// TestNotMigratedAdviceSaysToCheckTheSchema: a command on a schema without
// gendurable tables advises migrating it, and checking --schema first:
// after the README's demo, `list` looked in public and its only advice was
// to install empty tables there (a newcomer's probe).
func TestNotMigratedAdviceSaysToCheckTheSchema(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 1})
	for _, args := range [][]string{{"list"}, {"status"}, {"show", "1"}} {
		_, errOut, code := cli(t, append(args, "--schema", schema)...)
		require.Equal(t, 1, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, "has no gendurable tables", "%q", args)
		require.Contains(t, errOut, "(or check --schema: the demo works in gendurable_demo)", "%q", args)
		require.Contains(t, errOut, fmt.Sprintf("gendurable: schema not migrated: schema %q has no", schema),
			"%q: no inner call name (\"queue counts: \", a newcomer's probe)", args)
	}
}

// TestUIAnswersRequestsUnderWayWhenInterrupted: a SIGTERM (or Ctrl-C) stops
// `gendurable ui` taking connections, but a request under way is still
// answered, its action done and audit-logged, before the process exits.
// Before, the command returned as soon as http.Server.Serve did — at the
// start of Shutdown — and the process exited under the request: the client
// got nothing, the cancel was not done (a bulk action could be stopped
// between batches) and no audit line was written. The request here is a
// cancel whose body is held back until the server is stopping (Expect:
// 100-continue says when its handler is reading it).
func TestUIAnswersRequestsUnderWayWhenInterrupted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := dbtest.NewSchema(t, nil)
	seed(t, pool, schema, 1, "queue, status", "'q', 'runnable'")
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM "`+schema+`".gendurable_instances`).Scan(&id))

	cmd, stdout, stderr := launchUI(t, nil, "--schema", schema)
	exited := make(chan error, 1)
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "stderr: %s", stderr)
	go func() { exited <- cmd.Wait() }()
	addr := strings.TrimSuffix(strings.TrimPrefix(strings.Fields(line)[2], "http://"), "/")

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(time.Minute)))
	body := "reason=interrupted"
	_, err = fmt.Fprintf(conn, "POST /instances/%d/cancel HTTP/1.1\r\nHost: %s\r\n"+
		"Content-Type: application/x-www-form-urlencoded\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", id, addr, len(body))
	require.NoError(t, err)
	resp := bufio.NewReader(conn)
	status, err := resp.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 100 Continue\r\n", status, "the handler reads the body")
	_, err = resp.ReadString('\n')
	require.NoError(t, err)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { // stopping: no new connection is taken
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "stderr: %s", stderr)
	_, err = io.WriteString(conn, body)
	require.NoError(t, err)
	status, err = resp.ReadString('\n')
	require.NoError(t, err, "the request under way is answered; stderr: %s", stderr)
	require.Equal(t, "HTTP/1.1 303 See Other\r\n", status)

	select {
	case err := <-exited:
		require.NoError(t, err, "exit 0 once the request is answered; stderr: %s", stderr)
		exited <- err // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30 s after SIGTERM with no request under way; stderr: %s", stderr)
	}
	require.Contains(t, stderr.String(), "gendurable: ui: stopping; answering the requests under way first")
	require.Contains(t, stderr.String(), `msg="dashboard audit: cancel" action=cancel outcome=ok status=303`)
	require.Equal(t, 1, countRows(t, pool, schema, fmt.Sprintf("id = %d AND status = 'failed'", id)))
}

// TestUISecretFilesAreBoundedAndOneLine: --token-file and --basic-auth-file
// read at most 4 KiB (before, the whole file: --token-file /dev/zero grew
// the process by hundreds of MB a second until it was killed, and a 64 KiB
// file became a 64 KiB token), and a credential with a line break inside is
// refused (before, the dashboard started and refused every login). Both
// are exit 2 before anything is served; the database URL here has nothing
// listening.
func TestUISecretFilesAreBoundedAndOneLine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	big := write("big", strings.Repeat("a", 64<<10))
	twoLines := write("two", "first-line-of-token\nsecond-line\n")
	basicTwoLines := write("basic", "ops:pass\nword\n")
	// A blank line after is a second line too (a probe: every trailing
	// line break was dropped, though one is documented).
	basicBlankLine := write("basic-blank", "ops:password\n\n")
	tokenBlankLine := write("token-blank", "tok\n\n") // the dashboard trims it: refused by the command
	tokenTab := write("token-tab", "to\tk\n")
	crlf := write("crlf", "ops:password with space \r\n")
	fine := write("fine", strings.Repeat("t", 4<<10-1)+"\n") // 4 KiB with its line break: one token
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	for _, c := range []struct {
		args []string
		want string
	}{
		// Only a regular file (a hostile probe: opening a FIFO blocked the
		// command, deaf to Ctrl-C, until kill -9).
		{[]string{"--token-file", fifo}, "not a regular file"},
		{[]string{"--basic-auth-file", "/dev/zero"}, "not a regular file"},
		{[]string{"--token-file", big}, "longer than 4096 bytes"},

		{[]string{"--basic-auth-file", big}, "longer than 4096 bytes"},
		{[]string{"--token-file", twoLines}, "control character"},
		{[]string{"--basic-auth-file", basicTwoLines}, "control character"},
		{[]string{"--basic-auth-file", basicBlankLine}, "control character"},
		{[]string{"--token-file", tokenBlankLine}, "control character"},
		{[]string{"--token-file", tokenTab}, "control character"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var stdout, stderr strings.Builder
		code := run(ctx, append([]string{"ui", "--addr", "127.0.0.1:0", "--database-url", "postgres://postgres@127.0.0.1:1/none"}, c.args...), &stdout, &stderr)
		cancel()
		require.Equal(t, exitUsage, code, "%q: %s", c.args, stderr.String())
		require.Contains(t, stderr.String(), c.want, "%q", c.args)
		require.Empty(t, stdout.String(), "%q: nothing served", c.args)
	}
	tok, err := secret("token", "", fine, envUIToken, io.Discard)
	require.NoError(t, err)
	require.Len(t, tok, 4<<10-1)
	basic, err := secret("basic-auth", "", crlf, envUIBasicAuth, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "ops:password with space ", basic, "one CRLF dropped, the password as written")
}

// TestErrorsAreJSONWhateverTheSpellingOfJSON: with --json every error is
// JSON on stderr, however --json is spelt; the flag package takes any
// strconv.ParseBool value. Before, --json=T, --json=True or --json=TRUE turned
// JSON output on but errors came out as text (only -json, --json, =true and
// =1 were recognized), and --json --json=false printed them as JSON.
func TestErrorsAreJSONWhateverTheSpellingOfJSON(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		flags  []string
		asJSON bool
	}{
		{[]string{"--json"}, true}, {[]string{"-json"}, true}, {[]string{"--json=true"}, true}, {[]string{"--json=1"}, true},
		{[]string{"--json=t"}, true}, {[]string{"--json=T"}, true}, {[]string{"--json=True"}, true}, {[]string{"-json=TRUE"}, true},
		{[]string{"--json=false"}, false}, {[]string{"--json=0"}, false}, {[]string{"--json=F"}, false},
		{[]string{"--json", "--json=false"}, false}, {[]string{"--json=false", "--json"}, true},
		{[]string{"--", "--json"}, false},
	} {
		var stdout, stderr strings.Builder
		code := run(context.Background(), append([]string{"list", "--limit", "0"}, c.flags...), &stdout, &stderr)
		require.Equal(t, exitUsage, code, "%q: %s", c.flags, stderr.String())
		var e struct{ Error struct{ Code string } }
		err := json.Unmarshal([]byte(stderr.String()), &e)
		if c.asJSON {
			require.NoError(t, err, "%q: %s", c.flags, stderr.String())
			require.Equal(t, "usage", e.Error.Code, "%q", c.flags)
		} else {
			require.Error(t, err, "%q: %s", c.flags, stderr.String())
			require.True(t, strings.HasPrefix(stderr.String(), "gendurable: list"), "%q: %s", c.flags, stderr.String())
		}
	}
}

// TestDemoBoundsOrdersAndWorkers: --orders and --workers are bounded (a
// demo, not a load test) and checked before any connection. Before,
// --orders 9223372036854775807 passed the check (positive) and the demo,
// after creating its schema, panicked building the orders in memory
// (makeslice: len out of range); a value merely large, such as 100000000,
// would allocate them all, and --workers started that many engines.
func TestDemoBoundsOrdersAndWorkers(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1})
	schema := scratchName(t, pool, "gdbound_")
	for _, args := range [][]string{
		{"--orders", "9223372036854775807"}, {"--orders", "100001"}, {"--workers", "65"}, {"--workers", "100000000"},
	} {
		_, errOut, code := cli(t, append([]string{"demo", "--schema", schema}, args...)...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
		require.NotContains(t, errOut, "panic", "%q", args)
		require.Contains(t, errOut, "demo: --orders must be within 1..100000 and --workers within 1..64", "%q", args)
		require.False(t, schemaExists(t, pool, schema), "%q: refused before the schema was created", args)
	}
}

// TestBenchBoundsQueuesAndEngines: bench's --queues, --engines and --floor are
// bounded and checked before any connection. Before, --queues
// 9223372036854775807 created bench's schema and then panicked building the
// queue names (makeslice: len out of range), and --engines
// 9223372036854775807 overflowed the pool size ("MaxSize must be >= 1",
// exit 1) after creating it.
func TestBenchBoundsQueuesAndEngines(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1})
	schema := scratchName(t, pool, "gdbench_")
	for _, args := range [][]string{
		{"--queues", "9223372036854775807"}, {"--engines", "9223372036854775807"}, {"--queues", "1001"}, {"--engines", "101"},
	} {
		_, errOut, code := cli(t, append([]string{"bench", "-n", "10", "--schema", schema}, args...)...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
		require.NotContains(t, errOut, "panic", "%q", args)
		require.Contains(t, errOut, "bench: --queues must be at most 1000 and --engines at most 100", "%q", args)
		require.False(t, schemaExists(t, pool, schema), "%q: refused before the schema was created", args)
	}
	// A count whose flag has a default of its own is at least 1: 0 ran
	// silently on the library's default, and -n -5 was told "0: the
	// default" while -n 0 was refused (a probe).
	for _, c := range [][2]string{{"-n", "0"}, {"-n", "-5"}, {"--engines", "0"}, {"--concurrency", "0"}, {"--queues", "0"},
		{"--queues", "-1"}, {"--fair-backlog", "0"}, {"--key-rate", "0"}} {
		_, errOut, code := cli(t, "bench", c[0], c[1], "--schema", schema)
		require.Equal(t, exitUsage, code, "%q: %s", c, errOut)
		require.Contains(t, errOut, "bench: "+c[0]+" must be at least 1 (default ", "%q", c)
		require.False(t, schemaExists(t, pool, schema))
	}
	// --floor N opens N connections, each seeding 5,000 rows: before, 2147483648
	// overflowed the pool's int32 size ("MaxSize must be >= 1", exit 1), and
	// 4294967297 wrapped to one connection over 21 trillion rows to seed.
	for _, n := range []string{"2147483648", "1001"} {
		_, errOut, code := cli(t, "bench", "--floor", n, "--schema", schema)
		require.Equal(t, exitUsage, code, "--floor %s: %s", n, errOut)
		require.Contains(t, errOut, "bench: --floor must be at most 1000 connections")
		require.False(t, schemaExists(t, pool, schema))
	}
}

// TestBadDatabaseURLIsAUsageErrorForEveryCommand: a --database-url that does
// not parse is exit 2 ("usage", "database URL: ..."), with its password
// masked, for every command. Before, the admin commands said so but
// migrate, demo and bench exited 1, as for a database that is down.
func TestBadDatabaseURLIsAUsageErrorForEveryCommand(t *testing.T) {
	t.Parallel()
	bad := "postgres://ops:topsecret@127.0.0.1:99999999/db"
	for _, cmd := range [][]string{
		{"status"}, {"migrate", "status"}, {"migrate", "up"}, {"migrate", "down", "--yes"},
		{"demo", "--schema", "gdnever"}, {"bench", "--schema", "gdnever"}, {"bench", "--floor", "2", "--schema", "gdnever"},
	} {
		var stdout, stderr strings.Builder
		code := run(context.Background(), append(append([]string{}, cmd...), "--database-url", bad), &stdout, &stderr)
		require.Equal(t, exitUsage, code, "%q: %s", cmd, stderr.String())
		require.Contains(t, stderr.String(), "gendurable: database URL: cannot parse", "%q", cmd)
		require.NotContains(t, stderr.String(), "topsecret", "%q", cmd)
	}
}

// TestUIAddrWithABadPortIsAUsageError: ui --addr with a port out of range
// (or an unknown service name) is exit 2, like any bad flag value, before the
// engine is made. Before, it was exit 1 from the listen ("invalid port").
func TestUIAddrWithABadPortIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1:-1", "[::1]:65536", "127.0.0.1:nosuchservice"} {
		var stdout, stderr strings.Builder
		code := run(context.Background(), []string{"ui", "--addr", addr, "--database-url", "postgres://postgres@127.0.0.1:1/none"}, &stdout, &stderr)
		require.Equal(t, exitUsage, code, "%s: %s", addr, stderr.String())
		require.Contains(t, stderr.String(), "gendurable: --addr", addr)
	}
}

// TestUIAddrInUseIsNoConnectionLost: a listen on --addr that fails (the
// port taken by another process) is exit 1, code "error", naming the flag.
// It was code connection_lost, with the advice that what the command
// changed may or may not have been committed (a hostile-operator probe):
// the listener's *net.OpError read as a connection to the database lost.
func TestUIAddrInUseIsNoConnectionLost(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, nil)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	out, errOut, code := cli(t, "ui", "--schema", schema, "--addr", taken.Addr().String(), "--json")
	require.Equal(t, 1, code, "%s%s", out, errOut)
	var e struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.Unmarshal([]byte(errOut), &e), errOut)
	require.Equal(t, "error", e.Error.Code, errOut)
	require.Contains(t, e.Error.Message, "--addr: listen tcp "+taken.Addr().String())
	require.Contains(t, e.Error.Message, "address already in use")
	require.NotContains(t, e.Error.Message, "committed")
}

// TestCLIRejectsBadInput: NUL-free but invalid UTF-8 or control characters
// in filters and queue names are a usage error (exit 2), not a database
// error (exit 1 with SQLSTATE 22021). (A NUL cannot travel in argv.)
func TestCLIRejectsBadInput(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	for _, args := range [][]string{
		{"list", "--queue", "\xff"},
		{"list", "--step", "\xff\xfe"},
		{"list", "--machine", "a\x1bb"},
		{"list", "--search", "\x1b[2J"},
		{"pause", "\xff"},
		{"resume", "\t"},
		{"pause", "a\x7fb"},
	} {
		_, errOut, code := cli(t, append(args, "--schema", schema)...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, "invalid input", "%q", args)
		require.NotContains(t, errOut, "SQLSTATE", "%q", args)
	}
	// A signal name or dedup key is checked by the same rule (no instance
	// needs to exist: nothing is looked up).
	for _, args := range [][]string{
		{"signal", "1", "a\x01b"},
		{"signal", "1", "\x1b[2J"},
		{"signal", "1", "tab\t"},
		{"signal", "1", "c1\u009b"},
		{"signal", "1", "go", "--dedup-key", "k\x7f"},
	} {
		_, errOut, code := cli(t, append(args, "--schema", schema)...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, "invalid signal", "%q", args)
		require.Contains(t, errOut, "control character", "%q", args)
	}
}

// startUI runs `gendurable ui` with extra environment and returns its base
// URL and its stderr; the process is killed at cleanup.
func startUI(t *testing.T, env []string, args ...string) (string, *syncbuf.Buffer) {
	t.Helper()
	_, stdout, stderr := launchUI(t, env, args...)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "stderr: %s", stderr)
	require.Contains(t, line, "dashboard on http://127.0.0.1:")
	return strings.TrimSuffix(strings.Fields(line)[2], "/"), stderr
}

// launchUI starts `gendurable ui --addr 127.0.0.1:0` with args, env added
// to the test's environment and the test database's URL, and returns it
// with its stdout and a buffer of its stderr; it is killed at the test's
// end if still running.
func launchUI(t *testing.T, env []string, args ...string) (*exec.Cmd, io.ReadCloser, *syncbuf.Buffer) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"ui", "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+dbtest.URL()), env...)
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, stdout, stderr
}

// call sends one request to a running ui and returns its status.
func call(t *testing.T, method, url, host, auth string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// TestUISecretsHostsAndAudit: credentials come from the environment or
// files (never needing the command line), are trimmed, and must be long
// beyond loopback; --allowed-host extends the Host check; actions and
// failed logins reach ui's stderr although it logs at Warn.
func TestUISecretsHostsAndAudit(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	// A known queue to pause (unknown ones are refused).
	_, err := pool.Exec(context.Background(), `INSERT INTO "`+schema+`".gendurable_queues (name) VALUES ('default')`)
	require.NoError(t, err)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	tokenFile := write("token", "file-token-0123456789\n")
	basicFile := write("basic", "ops:pw-from-a-file\n")
	empty := write("empty", "\n")

	// Refused before anything is served.
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"--addr", "0.0.0.0:0", "--token", "short-token"}, "at least 16 bytes"},
		{[]string{"GENDURABLE_UI_TOKEN=short-token"}, []string{"--addr", "0.0.0.0:0"}, "at least 16 bytes"},
		{nil, []string{"--addr", "0.0.0.0:0", "--token-file", write("short", "short\n")}, "at least 16 bytes"},
		{nil, []string{"--token", "x", "--token-file", tokenFile}, "not both"},
		{nil, []string{"--token-file", filepath.Join(dir, "missing")}, "--token-file"},
		{nil, []string{"--token-file", empty}, "empty"},
		{nil, []string{"--basic-auth-file", empty}, "empty"},
		{nil, []string{"--token", "   "}, "white space"},
		{nil, []string{"--trusted-origin", "ops.example"}, "TrustedOrigins"},
	} {
		cmd := exec.Command(binary, append([]string{"ui", "--schema", schema}, c.args...)...)
		cmd.Env = append(append(os.Environ(), "DATABASE_URL="+dbtest.URL()), c.env...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v %v: %s", c.env, c.args, out)
		require.Equal(t, exitUsage, ee.ExitCode(), "%v %v: %s", c.env, c.args, out)
		require.Contains(t, string(out), c.want, "%v %v", c.env, c.args)
	}

	// On every interface: the address printed is one to open here, and
	// says where it listens (it printed Go's "http://[::]:PORT/" for
	// --addr 0.0.0.0:PORT: a newcomer's probe).
	everywhere := exec.Command(binary, "ui", "--schema", schema, "--addr", "0.0.0.0:0")
	everywhere.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL(), "GENDURABLE_UI_TOKEN=env-token-0123456789")
	stdout, err := everywhere.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, everywhere.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	_ = everywhere.Process.Kill()
	_ = everywhere.Wait()
	require.NoError(t, err)
	require.Regexp(t, `^dashboard on http://localhost:\d+/ \(Ctrl-C to stop, listening on every interface\)\n$`, line)

	// A token from the environment (padded: trimmed), an allowed host.
	base, stderr := startUI(t, []string{"GENDURABLE_UI_TOKEN=  env-token-0123456789  "}, "--schema", schema,
		"--allowed-host", "ops.example")
	const good = "Bearer env-token-0123456789"
	require.Equal(t, http.StatusUnauthorized, call(t, "GET", base+"/", "", ""))
	require.Equal(t, http.StatusOK, call(t, "GET", base+"/", "", good))
	require.Equal(t, http.StatusOK, call(t, "GET", base+"/", "ops.example", good))
	require.Equal(t, http.StatusMisdirectedRequest, call(t, "GET", base+"/", "evil.example", good))
	require.Equal(t, http.StatusSeeOther, call(t, "POST", base+"/queues/default/pause", "", good))
	require.Equal(t, http.StatusUnauthorized, call(t, "GET", base+"/", "", "Bearer wrong"))
	require.Eventually(t, func() bool {
		s := stderr.String()
		return strings.Contains(s, "dashboard audit: pause") && strings.Contains(s, "dashboard audit: failed login")
	}, 5*time.Second, 20*time.Millisecond, "stderr: %s", stderr)
	require.Contains(t, stderr.String(), "user=bearer")
	require.NotContains(t, stderr.String(), "env-token", "the token is never logged")

	// Token and basic auth from files.
	base, stderr = startUI(t, nil, "--schema", schema, "--token-file", tokenFile, "--basic-auth-file", basicFile)
	require.Equal(t, http.StatusOK, call(t, "GET", base+"/", "", "Bearer file-token-0123456789"))
	require.Equal(t, http.StatusOK, call(t, "GET", base+"/", "", "Basic "+base64.StdEncoding.EncodeToString([]byte("ops:pw-from-a-file"))))
	require.Equal(t, http.StatusUnauthorized, call(t, "GET", base+"/", "", "Basic "+base64.StdEncoding.EncodeToString([]byte("ops:pw-from-a-file\n"))))
	require.NotContains(t, stderr.String(), "visible to every user", "no warning without secrets on the command line")

	// Behind a proxy that rewrites Host, an action's Origin is the public
	// one: refused unless --trusted-origin names it (a probe found no flag
	// for it, only the library's option).
	crossOrigin := func(base string) int {
		req, err := http.NewRequest("POST", base+"/queues/default/resume", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer file-token-0123456789")
		req.Header.Set("Origin", "https://ops.example")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, crossOrigin(base))
	base, _ = startUI(t, nil, "--schema", schema, "--token-file", tokenFile, "--trusted-origin", "https://ops.example")
	require.Equal(t, http.StatusSeeOther, crossOrigin(base))
}

// TestUIRefusesAnyHostWithoutCredentials: on loopback without credentials
// the Host check is all that keeps a web page whose DNS name was rebound to
// 127.0.0.1 from reading and driving the dashboard (its POSTs are
// same-origin to the browser). `--allowed-host '*'` turns that check off,
// so without --token or --basic-auth it is refused (exit 2), not served.
func TestUIRefusesAnyHostWithoutCredentials(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "ui", "--addr", "127.0.0.1:0", "--schema", schema, "--allowed-host", "*")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL())
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "it served: %s", out)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	require.Equal(t, exitUsage, ee.ExitCode(), "%s", out)
	require.Contains(t, string(out), "--allowed-host '*' needs a bearer token or basic auth (--token-file F, --basic-auth-file F, or GENDURABLE_UI_TOKEN / GENDURABLE_UI_BASIC_AUTH in the environment)")

	base, _ := startUI(t, []string{"GENDURABLE_UI_TOKEN=env-token-0123456789"}, "--schema", schema, "--allowed-host", "*")
	require.Equal(t, http.StatusUnauthorized, call(t, "GET", base+"/", "rebound.example", ""), "with a token, any host is served, to those who have it")
}

// TestUIEngineLinesAreNotTheCLIs: under `gendurable ui` an action is the
// dashboard user's, not the CLI's: the engine's own line of it (e.g.
// "queue paused") must not claim via=cli and the server's operating-system
// user, which read as if someone at the shell had done it; the dashboard's
// audit line names the dashboard user.
func TestUIEngineLinesAreNotTheCLIs(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	_, err := pool.Exec(context.Background(), `INSERT INTO "`+schema+`".gendurable_queues (name) VALUES ('default')`)
	require.NoError(t, err)
	base, stderr := startUI(t, []string{"GENDURABLE_UI_TOKEN=env-token-0123456789"}, "--schema", schema)
	require.Equal(t, http.StatusSeeOther, call(t, "POST", base+"/queues/default/pause", "", "Bearer env-token-0123456789"))
	require.Eventually(t, func() bool {
		s := stderr.String()
		return strings.Contains(s, "gendurable: queue paused") && strings.Contains(s, "dashboard audit: pause")
	}, 5*time.Second, 20*time.Millisecond, "stderr: %s", stderr)
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, "gendurable: queue paused") {
			require.NotContains(t, line, "via=cli", line)
			require.Contains(t, line, "via=ui", line)
		}
	}
}

// oneErrorLine checks that stderr is one line, "gendurable: ..." with the
// prefix once, and no flag package usage dump.
func oneErrorLine(t *testing.T, args []string, stderr string) {
	t.Helper()
	require.Equal(t, 1, strings.Count(stderr, "\n"), "%q: one line: %s", args, stderr)
	require.True(t, strings.HasPrefix(stderr, "gendurable: "), "%q: %s", args, stderr)
	require.NotContains(t, stderr, "gendurable: gendurable", "%q", args)
	require.NotContains(t, stderr, "Usage of", "%q", args)
	require.NotContains(t, stderr, "SQLSTATE", "%q", args)
}

// jsonError decodes a --json error from stderr and checks its shape.
func jsonError(t *testing.T, args []string, stderr string, code string, exit int) string {
	t.Helper()
	return jsonErrorIn(t, args, stderr, []string{code}, exit)
}

func jsonErrorIn(t *testing.T, args []string, stderr string, codes []string, exit int) string {
	t.Helper()
	var e struct {
		Error map[string]any `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(stderr), &e), "%q: %s", args, stderr)
	require.Contains(t, codes, e.Error["code"], "%q: %s", args, stderr)
	require.EqualValues(t, exit, e.Error["exit_code"], "%q", args)
	msg, _ := e.Error["message"].(string)
	require.True(t, strings.HasPrefix(msg, "gendurable: "), "%q: %s", args, msg)
	require.NotContains(t, msg, "gendurable: gendurable", "%q", args)
	require.Len(t, e.Error, 3, "code, message, exit_code")
	return msg
}

// TestBadFlagValuesExitTwoWithOneMessage (issue 14 item 6): every bad flag
// value or argument exits 2 with one error line (no usage dump, one
// prefix), or with --json one {"error": {...}} object on stderr; nothing
// reaches stdout.
func TestBadFlagValuesExitTwoWithOneMessage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"prune", "--retention", "abc"},
		{"prune", "--retention", "-1h"},
		{"list", "--since", "2x"},
		{"list", "--since", "-1h"},
		{"list", "--status", "bogus"},
		{"list", "--limit", "0"},
		{"list", "--limit", "501"},
		{"list", "--scan", "0"},
		{"list", "--before", "-1"},
		{"list", "--before", "0"}, // read as no cursor, it listed the first page again
		{"list", "--nosuchflag"},
		{"list", "extra"},
		{"status", "extra"},
		{"status", "--database-url", "postgres://x@[::1"},
		{"show"},
		{"show", "abc"},
		{"show", "1", "2"},
		{"signal", "1"},
		{"signal", "1", "go", "--payload", "{nope"},
		{"retry"},
		{"retry", "abc"},
		{"retry", "1", "--queue", "q"},
		{"retry", "--status", "failed"}, // a filter needs --yes off a terminal
		{"cancel", "--all"},
		{"cancel", "--queue", "q", "--since", "1y"},
		{"cancel", "--tree", "1"}, // a tree needs --yes off a terminal
		{"cancel", "--tree", "--yes"},
		{"cancel", "--tree", "1", "2", "--yes"},
		{"cancel", "--tree", "1", "--queue", "q", "--yes"},
		{"cancel", "--tree", "0", "--yes"},
		{"cancel", "--tree", "-5", "--yes"},
		{"cancel", "--tree", "abc", "--yes"},
		{"cancel", "--tree", "1x", "--yes"},
		{"cancel", "--tree", "--all", "--yes"},
		{"cancel", "--tree", "1", "--all", "--yes"},
		{"cancel", "--tree", "1", "--status", "failed", "--yes"},
		{"cancel", "--tree", "1", "--since", "1h", "--yes"},
		{"cancel", "--tree", "1", "--search", "k", "--yes"},
		{"cancel", "--tree", "1", "--machine", "m", "--step", "s", "--yes"},
		{"retry", "--tree", "1", "--yes"},                  // no retry of a tree
		{"cancel", "--tree", "1", "--scan", "50", "--yes"}, // --scan bounds a filter, not a tree
		{"cancel", "1", "2", "--scan", "50"},
		{"retry", "1", "--scan", "50"},
		{"cancel", "1", "--reason", "\xff"},
		{"cancel", "1", "--reason", ""},                                                   // the library would record its own default, not the CLI's
		{"cancel", "1", "--reason", " "},                                                  // nothing to read either
		{"cancel", "--all", "--reason", strings.Repeat("r", gendurable.MaxReasonBytes+1)}, // before asking to confirm
		{"run-now"},
		{"run-now", "0"},
		{"pause"},
		{"queue", "frob", "x"},
		{"migrate"},
		{"migrate", "sideways"},
		{"migrate", "up", "extra"},
		{"migrate", "up", "--schema", "1bad"},
		{"list", "--schema", "bad-name"},
		{"bench", "--workload", "nope"},
		{"bench", "-n", "-1"},
		{"bench", "--heartbeat", "-1s"},
		{"bench", "--step-sleep", "-1s"},
		{"bench", "--workload", "partition", "--step-sleep", "1ms"},
		{"demo", "--orders", "0"},
		{"ui", "--max-conns", "0"},
		{"ui", "--max-conns", "99999999999"},
		{"show", "+4"},
		{"frobnicate"},
	} {
		out, errOut, code := cli(t, args...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
		require.Empty(t, out, "%q", args)
		oneErrorLine(t, args, errOut)

		jargs := append(slices.Clone(args), "--json")
		out, errOut, code = cli(t, jargs...)
		require.Equal(t, exitUsage, code, "%q: %s", jargs, errOut)
		require.Empty(t, out, "%q", jargs)
		jsonErrorIn(t, jargs, errOut, []string{"usage", "invalid_input"}, exitUsage)
	}
}

// TestBadFlagValueSaysTheFormItWants: where the flag package can only say
// "parse error", the message says what form the value takes.
func TestBadFlagValueSaysTheFormItWants(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "--since", "2x"}, "want a duration such as 30s, 5m or 2h"},
		{[]string{"prune", "--retention", "abc"}, "want a duration such as 30s, 5m or 2h"},
		{[]string{"list", "--limit", "ten"}, "want a whole number"},
	} {
		_, errOut, code := cli(t, c.args...)
		require.Equal(t, exitUsage, code, "%q: %s", c.args, errOut)
		require.Contains(t, errOut, c.want, "%q", c.args)
	}
}

// TestHelpOnEveryCommand: `gendurable CMD --help` (and -h, and `help CMD`)
// prints the command's synopsis, with its positional arguments, and its
// flags to stdout and exits 0.
func TestHelpOnEveryCommand(t *testing.T) {
	t.Parallel()
	want := map[string]string{"show": "show ID", "signal": "signal ID NAME", "migrate": "migrate up|down|status|print",
		"retry": "retry ID [ID...]", "cancel": "cancel ID [ID...]", "run-now": "run-now ID", "pause": "pause QUEUE",
		"resume": "resume QUEUE", "queue": "queue remove QUEUE"}
	for name := range commands {
		for _, args := range [][]string{{name, "--help"}, {name, "-h"}, {"help", name}} {
			out, errOut, code := cli(t, args...)
			require.Equal(t, 0, code, "%q: %s", args, errOut)
			require.Empty(t, errOut, "%q", args)
			require.True(t, strings.HasPrefix(out, "usage: gendurable "+name), "%q: %s", args, out)
			require.Contains(t, out, "flags:\n", "%q", args)
			if w, ok := want[name]; ok {
				require.Contains(t, out, "usage: gendurable "+w, "%q", args)
			}
			// Every command reads DATABASE_URL when --database-url is not
			// given (migrate and bench did too, though their help said
			// only "PostgreSQL URL").
			if i := strings.Index(out, "-database-url string\n"); i >= 0 {
				line, _, _ := strings.Cut(out[i+len("-database-url string\n"):], "\n")
				require.Contains(t, line, "default DATABASE_URL", "%q", args)
			}
			if name == "version" { // not a database command
				require.NotContains(t, out, "-database-url", "%q", args)
				continue
			}
			// As `gendurable --help` says: every database command takes
			// --database-url, --schema and --json, but demo has no --json.
			require.Contains(t, out, "-database-url", "%q", args)
			require.Contains(t, out, "-schema", "%q", args)
			if name == "demo" {
				require.NotContains(t, out, "-json", "%q", args)
			} else {
				require.Contains(t, out, "-json", "%q", args)
			}
		}
	}
	out, _, code := cli(t, "migrate", "up", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "-yes")
	out, _, code = cli(t, "queue", "remove", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "queue remove QUEUE")
}

// TestMigrateHintNamesTheDatabase: the advice to migrate says which
// database it is about — a newcomer took the default server's "not
// migrated" for their own database's — and never repeats a URL given.
func TestMigrateHintNamesTheDatabase(t *testing.T) {
	msg := "gendurable: schema not migrated: schema \"s\" has no gendurable tables; run `gendurable migrate up --schema s` (or migrate.Up) first"
	require.Equal(t, "gendurable: schema not migrated: schema \"s\" has no gendurable tables; run `gendurable migrate up --schema s` first (the database is the default, "+
		defaultDatabaseURL+", as neither --database-url nor DATABASE_URL was set)", migrateHint(msg, ""))
	require.Equal(t, "gendurable: schema not migrated: schema \"s\" has no gendurable tables; run `gendurable migrate up --schema s` first (the database is DATABASE_URL's)",
		migrateHint(msg, "DATABASE_URL"))
	require.Equal(t, "gendurable: schema not migrated: schema \"s\" has no gendurable tables; run `gendurable migrate up --schema s` with the same --database-url first",
		migrateHint(msg, "--database-url"))
	require.Equal(t, "gendurable: instance not found: id 1", migrateHint("gendurable: instance not found: id 1", ""))
}

// TestErrorsNotFoundAndNotMigrated: a missing instance is one line with one
// prefix (exit 3); a schema that was never migrated says to run
// `gendurable migrate up` instead of the database's "relation ... does not
// exist" (exit 1); with --json both are {"error": {...}} on stderr.
func TestErrorsNotFoundAndNotMigrated(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	args := []string{"show", "999999", "--schema", schema}
	_, errOut, code := cli(t, args...)
	require.Equal(t, exitNotFound, code)
	require.Equal(t, "gendurable: instance not found: id 999999\n", errOut)
	_, errOut, code = cli(t, append(args, "--json")...)
	require.Equal(t, exitNotFound, code)
	require.Equal(t, "gendurable: instance not found: id 999999", jsonError(t, args, errOut, "not_found", exitNotFound))

	bare := scratchName(t, pool, "gdbare_")
	_, err := pool.Exec(context.Background(), `CREATE SCHEMA "`+bare+`"`)
	require.NoError(t, err)
	for _, schema := range []string{bare, "gd_no_such_schema"} {
		for _, args := range [][]string{{"status"}, {"list"}, {"show", "1"}, {"retry", "1"}, {"cancel", "--all", "--yes"},
			{"run-now", "1"}, {"signal", "1", "go"}, {"prune"}, {"pause", "default"}, {"machines"}, {"machines", "order"}} {
			args = append(args, "--schema", schema)
			out, errOut, code := cli(t, args...)
			require.Equal(t, exitError, code, "%q: %s", args, errOut)
			require.Empty(t, out, "%q", args)
			oneErrorLine(t, args, errOut)
			require.Contains(t, errOut, "run `gendurable migrate up --schema "+schema+"`", "%q", args)
			require.Contains(t, errOut, "(the database is DATABASE_URL's)", "%q: which database is not migrated", args)
			require.NotContains(t, errOut, "does not exist", "%q", args)
			require.NotContains(t, errOut, "migrate.Up", "%q: the Go API's name in a command's advice", args)
			_, errOut, code = cli(t, append(args, "--json")...)
			require.Equal(t, exitError, code)
			require.Contains(t, jsonError(t, args, errOut, "not_migrated", exitError), "gendurable migrate up")
		}
	}

	// Given --database-url, the advice names it: pasted without it, it
	// migrated DATABASE_URL's database.
	_, errOut, code = cli(t, "status", "--schema", bare, "--database-url", dbtest.URL())
	require.Equal(t, exitError, code, errOut)
	require.Contains(t, errOut, "run `gendurable migrate up --schema "+bare+"` with the same --database-url first")
	require.NotContains(t, errOut, "<", "a placeholder the shell reads as a redirect")

	// A schema at an older version: the versions and the command to run,
	// not "column ... does not exist".
	old := scratchName(t, pool, "gdold_")
	_, err = migrate.To(context.Background(), pool, old, 1)
	require.NoError(t, err)
	for _, args := range [][]string{{"status"}, {"signal", "1", "go"}} {
		args = append(args, "--schema", old)
		_, errOut, code := cli(t, args...)
		require.Equal(t, exitError, code, "%q: %s", args, errOut)
		oneErrorLine(t, args, errOut)
		require.Contains(t, errOut, "is at version 1, this library needs", "%q", args)
		require.Contains(t, errOut, "run `gendurable migrate up --schema "+old+"`", "%q", args)
		require.NotContains(t, errOut, "does not exist", "%q", args)
		_, errOut, code = cli(t, append(args, "--json")...)
		require.Equal(t, exitError, code)
		require.Contains(t, jsonError(t, args, errOut, "not_migrated", exitError), "gendurable migrate up")
	}
}

// TestFlagsBeforeTheCommandSayWhereTheyGo: `gendurable --database-url URL
// status` is exit 2 with a line saying that flags go after the command,
// naming it, without repeating the URL (it may hold a password); with
// --json the error is JSON. Before, it was `unknown command
// "--database-url"`.
func TestFlagsBeforeTheCommandSayWhereTheyGo(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--database-url", "postgres://ops:topsecret@127.0.0.1:1/db", "status"}, "gendurable: --database-url before the command: flags go after it (gendurable status --database-url …"},
		{[]string{"--schema=s", "list", "--limit", "3"}, "gendurable: --schema before the command: flags go after it (gendurable list --schema …"},
		{[]string{"--schema", "s"}, "gendurable: --schema before the command: flags go after it (gendurable <command> --schema …"},
	} {
		var stdout, stderr strings.Builder
		code := run(context.Background(), c.args, &stdout, &stderr)
		require.Equal(t, exitUsage, code, "%q: %s", c.args, stderr.String())
		require.Empty(t, stdout.String())
		oneErrorLine(t, c.args, stderr.String())
		require.Contains(t, stderr.String(), c.want, "%q", c.args)
		require.NotContains(t, stderr.String(), "topsecret", "%q", c.args)
	}
	args := []string{"--json", "status"}
	var stdout, stderr strings.Builder
	require.Equal(t, exitUsage, run(context.Background(), args, &stdout, &stderr))
	require.Contains(t, jsonError(t, args, stderr.String(), "usage", exitUsage), "--json before the command")
}

// TestConnectionFailuresAreOneReadableLine: a database URL that names a
// port nothing listens on, or a database that does not exist, is one line
// saying so — each failure once, no "\x0a\x09" from pgx's multi-line
// report, no TLS attempt's noise — and where the URL comes from (exit 1).
// Before, it was pgx's report with its newlines escaped, every line twice,
// and ui served pages that all failed.
func TestConnectionFailuresAreOneReadableLine(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())
	noDB, err := url.Parse(dbtest.URL())
	require.NoError(t, err)
	noDB.Path = "/gd_no_such_database"

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--database-url", "postgres://postgres@" + closed + "/postgres"}, "connect: connection refused"},
		{[]string{"list", "--database-url", "postgres://postgres@" + closed + "/postgres?sslmode=disable"}, "connect: connection refused"},
		{[]string{"migrate", "up", "--database-url", noDB.String()}, `database "gd_no_such_database" does not exist`},
		{[]string{"demo", "--database-url", "postgres://postgres@" + closed + "/postgres"}, "connect: connection refused"},
		// ui checks the database before it serves: not a page of 500s.
		{[]string{"ui", "--addr", "127.0.0.1:0", "--database-url", noDB.String()}, `database "gd_no_such_database" does not exist`},
	} {
		_, errOut, code := cli(t, c.args...)
		require.Equal(t, exitError, code, "%q: %s", c.args, errOut)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "%q: one line: %s", c.args, errOut)
		require.Contains(t, errOut, "cannot connect to the database as user postgres, database ", "%q", c.args)
		require.Equal(t, 1, strings.Count(errOut, c.want), "%q: said once: %s", c.args, errOut)
		require.NotContains(t, errOut, `\x0a`, "%q", c.args)
		require.NotContains(t, errOut, "tls error", "%q", c.args)
		// Where this run's URL came from: the flag it gave (a newcomer read
		// the whole chain of defaults after giving --database-url).
		require.Contains(t, errOut, "(the database is --database-url)", "%q", c.args)
		if c.args[0] == "demo" {
			continue // no --json
		}

		_, errOut, code = cli(t, append(c.args, "--json")...)
		require.Equal(t, exitError, code)
		msg := jsonError(t, c.args, errOut, "cannot_connect", exitError)
		require.NotContains(t, msg, "\n", "%q", c.args)
		require.Equal(t, 1, strings.Count(msg, c.want), "%q: %s", c.args, msg)
	}
}

// lhEnv is a long-horizon adapter's environment: schema, then NAME=value pairs.
func lhEnv(schema string, kv ...string) []string {
	url := dbtest.URL()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	env := []string{"DATABASE_URL=" + url + sep + "pool_max_conns=6", "GENDURABLE_SCHEMA=" + schema}
	for _, e := range os.Environ() {
		if k, _, _ := strings.Cut(e, "="); !strings.Contains(" DATABASE_URL SCENARIO PRODUCER_MODE PRODUCER_RATE TARGET_DEPTH WORKER_COUNT JOB_PAYLOAD_BYTES JOB_WORK_MS SAMPLE_EVERY_S BENCH_INSTANCE_ID PRODUCER_RATE_CONTROL_FILE GENDURABLE_SCHEMA ", " "+k+" ") {
			env = append(env, e)
		}
	}
	return append(env, kv...)
}

// TestBenchLongHorizonProtocol runs `gendurable bench --long-horizon` as the
// benchmark's harness does: the first stdout line is the descriptor, then
// every SAMPLE_EVERY_S (aligned to the wall clock) one line per metric with
// the protocol's fields; jobs are produced, claimed and completed; SIGTERM
// ends it with exit 0 within 5 s.
func TestBenchLongHorizonProtocol(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 1, Extra: 6})
	cmd := exec.Command(binary, "bench", "--long-horizon")
	cmd.Env = lhEnv(schema, "SCENARIO=long_horizon", "PRODUCER_MODE=fixed", "PRODUCER_RATE=200", "WORKER_COUNT=8", "SAMPLE_EVERY_S=1")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill() }()

	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() map[string]any {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("stdout closed early; stderr:\n%s", stderr.String())
			}
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &m), "not a JSON line: %q", l)
			return m
		case <-time.After(30 * time.Second):
			t.Fatalf("no line in 30s; stderr:\n%s", stderr.String())
			return nil
		}
	}
	d := next()
	require.Equal(t, "descriptor", d["kind"])
	require.Equal(t, "gendurable", d["system"])
	require.Equal(t, []any{schema + ".gendurable_instances"}, d["event_tables"])
	require.Equal(t, []any{}, d["extensions"])
	require.Equal(t, strconv.Itoa(migrate.Latest()), d["schema_version"])
	for _, k := range []string{"version", "db_name", "started_at"} {
		require.NotEmpty(t, d[k], k)
	}
	var db string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db))
	require.Equal(t, db, d["db_name"], "the database connected to (a URL naming none reads as empty in the config)")

	want := []string{"claim_p50_ms", "claim_p95_ms", "claim_p99_ms", "enqueue_rate", "completion_rate", "queue_depth", "producer_target_rate"}
	windows := map[string]float64{"claim_p50_ms": 30, "claim_p95_ms": 30, "claim_p99_ms": 30, "enqueue_rate": 1, "completion_rate": 1, "queue_depth": 0, "producer_target_rate": 0}
	var last map[string]float64
	for tick := 0; tick < 4; tick++ {
		got := map[string]float64{}
		var at string
		for _, metric := range want {
			s := next()
			require.Len(t, s, 9, "fields of %v", s)
			require.Equal(t, metric, s["metric"])
			require.Equal(t, "gendurable", s["system"])
			require.Equal(t, "adapter", s["kind"])
			require.Equal(t, "adapter", s["subject_kind"])
			require.Equal(t, "", s["subject"])
			require.Equal(t, windows[metric], s["window_s"], metric)
			require.Equal(t, float64(0), s["instance_id"])
			ts, err := time.Parse(time.RFC3339Nano, s["t"].(string))
			require.NoError(t, err)
			require.Zero(t, ts.Nanosecond(), "samples are aligned to whole seconds: %s", s["t"])
			if at == "" {
				at = s["t"].(string)
			}
			require.Equal(t, at, s["t"], "one timestamp per tick")
			got[metric] = s["value"].(float64)
		}
		last = got
	}
	require.Equal(t, float64(200), last["producer_target_rate"])
	require.Greater(t, last["enqueue_rate"], 100.0)
	require.Greater(t, last["completion_rate"], 100.0)
	require.Greater(t, last["claim_p50_ms"], 0.0)
	require.GreaterOrEqual(t, last["claim_p99_ms"], last["claim_p95_ms"])
	require.GreaterOrEqual(t, last["claim_p95_ms"], last["claim_p50_ms"])

	var done int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+schema+`.gendurable_instances WHERE status = 'done'`).Scan(&done))
	require.Greater(t, done, 200)

	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	exited := make(chan error, 1)
	go func() {
		for l := range lines { // whatever it writes until it exits is JSON lines too
			if !json.Valid([]byte(l)) {
				exited <- fmt.Errorf("not a JSON line after SIGTERM: %q", l)
				return
			}
		}
		exited <- cmd.Wait()
	}()
	select {
	case err := <-exited:
		require.NoError(t, err, "exit after SIGTERM; stderr:\n%s", stderr.String())
	case <-time.After(8 * time.Second):
		t.Fatalf("still running 8 s after SIGTERM; stderr:\n%s", stderr.String())
	}
	require.Less(t, time.Since(start), 5*time.Second)
}

// TestBenchLongHorizonRejectsBadEnvironment: a wrong or missing variable is
// exit 2 with a message naming it, and nothing on stdout.
func TestBenchLongHorizonRejectsBadEnvironment(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"PRODUCER_RATE=200"}, "WORKER_COUNT is not set"},
		{[]string{"WORKER_COUNT=8"}, "PRODUCER_RATE is not set"},
		{[]string{"WORKER_COUNT=8", "PRODUCER_RATE=fast"}, `PRODUCER_RATE="fast"`},
		{[]string{"WORKER_COUNT=0", "PRODUCER_RATE=200"}, `WORKER_COUNT="0"`},
		{[]string{"WORKER_COUNT=8", "PRODUCER_MODE=depth-target"}, "TARGET_DEPTH is not set"},
		{[]string{"WORKER_COUNT=8", "PRODUCER_MODE=burst", "PRODUCER_RATE=1"}, `PRODUCER_MODE "burst"`},
		{[]string{"WORKER_COUNT=8", "PRODUCER_RATE=1", "SCENARIO=soak"}, `SCENARIO "soak"`},
		{[]string{"WORKER_COUNT=8", "PRODUCER_RATE=1", "SAMPLE_EVERY_S=0.5"}, `SAMPLE_EVERY_S="0.5"`},
		{[]string{"WORKER_COUNT=8", "PRODUCER_RATE=1", "JOB_PAYLOAD_BYTES=-1"}, `JOB_PAYLOAD_BYTES="-1"`},
		{[]string{"WORKER_COUNT=8", "PRODUCER_RATE=1", "GENDURABLE_SCHEMA=a;b"}, "GENDURABLE_SCHEMA"},
		{[]string{"WORKER_COUNT=8", "PRODUCER_RATE=1", "DATABASE_URL="}, "DATABASE_URL is not set"},
	} {
		cmd := exec.Command(binary, "bench", "--long-horizon")
		cmd.Env = lhEnv("gdtest_never_created", c.env...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v", c.env)
		require.Equal(t, 2, ee.ExitCode(), "%v: %s", c.env, errb.String())
		require.Contains(t, errb.String(), c.want, "%v", c.env)
		require.Empty(t, out.String(), "%v", c.env)
	}
	_, errOut, code := cli(t, "bench", "--long-horizon", "-n", "5")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "configured by the environment only")

	// A database that does not answer: exit 1, and the hint names the one
	// place its database comes from.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close())
	cmd := exec.Command(binary, "bench", "--long-horizon")
	cmd.Env = lhEnv("gdtest_never_created", "WORKER_COUNT=8", "PRODUCER_RATE=1", "DATABASE_URL=postgres://postgres@"+closed+"/postgres")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var ee *exec.ExitError
	require.ErrorAs(t, cmd.Run(), &ee)
	require.Equal(t, 1, ee.ExitCode(), errb.String())
	require.Contains(t, errb.String(), "connection refused (the database is DATABASE_URL)\n")
	require.Empty(t, out.String())
}

// TestSilentServerIsAConnectionErrorInBoundedTime: a database URL whose
// server accepts the connection and then never answers (a network cut off
// behind a proxy, a stopped server process) is, after the CLI's default
// connect timeout (10 s: the URL sets none), one line saying it cannot
// connect, exit 1. The commands used to wait for ever (pgx's default is no
// timeout): `status` was still waiting when this test killed it after 30 s.
func TestSilentServerIsAConnectionErrorInBoundedTime(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "status", "--database-url", "postgres://postgres@"+ln.Addr().String()+"/postgres")
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	t.Logf("status took %s: %v: %s", took.Round(time.Millisecond), err, errb.String())
	require.NoError(t, ctx.Err(), "still waiting after 30 s")
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, exitError, ee.ExitCode())
	// One error line, after the note that the command is still waiting
	// (the connect takes 10 s).
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	require.Len(t, lines, 2, "%s", errb.String())
	require.Contains(t, lines[0], "gendurable: status: still waiting on the database after 5s")
	require.Contains(t, lines[1], "cannot connect to the database as user postgres, database postgres")
	require.Less(t, took, 25*time.Second)
	// One connect, one timeout: the schema-version check that comes first
	// used to swallow its connect error, and the command connected again
	// (20 s, two connections, in a newcomer probe).
	mu.Lock()
	require.Len(t, held, 1, "connections the command opened")
	mu.Unlock()

	// The demo too: it connected without a timeout, and said nothing for
	// two minutes (a newcomer's probe).
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd = exec.CommandContext(ctx, binary, "demo", "--database-url", "postgres://postgres@"+ln.Addr().String()+"/postgres")
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=")
	errb.Reset()
	cmd.Stderr = &errb
	start = time.Now()
	err = cmd.Run()
	took = time.Since(start)
	t.Logf("demo took %s: %v: %s", took.Round(time.Millisecond), err, errb.String())
	require.NoError(t, ctx.Err(), "still waiting after 30 s")
	require.ErrorAs(t, err, &ee)
	require.NotEqual(t, 0, ee.ExitCode())
	require.Contains(t, errb.String(), "cannot connect to the database")
	require.Less(t, took, 25*time.Second)
}

// TestCLIMigrateToAVersion: `migrate up --to N` and `migrate down --to N`
// move to a version of the operator's choice (down asks, or --yes), refuse
// a version the other way or out of range, and `migrate print --from A
// --to B` prints only that step's SQL — the script a team's own migration
// tool needs for an upgrade (before, print gave only the full install,
// which fails on an existing schema, and up/down went only to the ends).
func TestCLIMigrateToAVersion(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	s := []string{"--schema", schema}
	last := migrate.Latest()
	out, _, code := cli(t, append([]string{"migrate", "up", "--to", strconv.Itoa(last - 1)}, s...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, fmt.Sprintf("version 0 → %d", last-1))
	_, errOut, code := cli(t, append([]string{"migrate", "down", "--to", strconv.Itoa(last)}, s...)...)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "above the installed version")
	out, _, code = cli(t, append([]string{"migrate", "up"}, s...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, fmt.Sprintf("version %d → %d", last-1, last))
	out, _, code = cli(t, append([]string{"migrate", "up"}, s...)...)
	require.Equal(t, 0, code, out)
	require.Equal(t, fmt.Sprintf("schema %s: version %d, nothing to apply\n", schema, last), out, "a no-op up says so (it said \"applied []\")")
	_, errOut, code = cli(t, append([]string{"migrate", "up", "--to", "3"}, s...)...)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "below the installed version")
	_, errOut, code = cli(t, append([]string{"migrate", "down", "--to", strconv.Itoa(last - 1)}, s...)...)
	require.NotEqual(t, 0, code, "down asks first")
	require.Contains(t, errOut, "pass --yes")
	out, _, code = cli(t, append([]string{"migrate", "down", "--yes", "--to", strconv.Itoa(last - 1)}, s...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, fmt.Sprintf("version %d → %d", last, last-1))
	for _, bad := range [][]string{{"up", "--to", strconv.Itoa(last + 1)}, {"down", "--to", "-2"}, {"up", "--from", "3"},
		{"status", "--to", "3"}, {"print", "--from", strconv.Itoa(last + 1)},
		// Not the default: a review's `down --to -1 --yes` dropped every table.
		{"down", "--to", "-1", "--yes"}, {"up", "--to", "-1"}, {"status", "--to", "-1"}} {
		_, errOut, code = cli(t, append(append([]string{"migrate"}, bad...), s...)...)
		require.Equal(t, 2, code, "%v: %s", bad, errOut)
	}
	out, _, code = cli(t, "migrate", "print", "--schema", "elsewhere", "--from", strconv.Itoa(last-1), "--to", strconv.Itoa(last))
	require.Equal(t, 0, code)
	require.NotContains(t, out, "CREATE TABLE", "only the step's SQL")
	require.Contains(t, out, fmt.Sprintf("gendurable schema version %d", last))
	require.Contains(t, out, "lock_timeout", "the script says how to run it on a database in use")
	// --json: one object, the script in it (a newcomer probe piped the
	// plain SQL into a JSON parser).
	out, _, code = cli(t, "migrate", "print", "--json", "--schema", "elsewhere", "--from", strconv.Itoa(last-1), "--to", strconv.Itoa(last))
	require.Equal(t, 0, code)
	var printed struct {
		Schema   string
		From, To int
		SQL      string
	}
	require.NoError(t, json.Unmarshal([]byte(out), &printed), out)
	require.Equal(t, "elsewhere", printed.Schema)
	require.Equal(t, []int{last - 1, last}, []int{printed.From, printed.To})
	require.Contains(t, printed.SQL, fmt.Sprintf("gendurable schema version %d", last))
	// From a version to itself: no SQL, and a line on stderr saying why
	// (it printed nothing at all, exit 0: read as a failure).
	out, errOut, code = cli(t, "migrate", "print", "--schema", "elsewhere", "--from", "5", "--to", "5")
	require.Equal(t, 0, code, errOut)
	require.Empty(t, out)
	require.Equal(t, "gendurable: migrate print: --from 5 and --to 5 are the same version: no SQL to print\n", errOut)
	v, err := migrate.Installed(context.Background(), pool, schema)
	require.NoError(t, err)
	require.Equal(t, last-1, v, "the refused commands changed nothing")
	// Another command against a schema a version behind: refused before it
	// reads or changes anything, saying what to run (a hostile-input probe:
	// prune, pause, signal and run-now ran against it).
	for _, cmd := range [][]string{{"status"}, {"list"}, {"prune", "--yes"}, {"pause", "q"}, {"signal", "1", "go"}} {
		args := append(append(cmd, "--json"), s...)
		_, errOut, code := cli(t, args...)
		require.Equal(t, exitError, code, "%v: %s", cmd, errOut)
		require.Contains(t, jsonError(t, args, errOut, "not_migrated", exitError), "migrate up")
	}

	// A schema newer than this binary: its own code, not "run migrate up".
	_, err = pool.Exec(context.Background(), fmt.Sprintf(`COMMENT ON TABLE "%s".gendurable_instances IS 'gendurable schema version %d'`,
		schema, last+1))
	require.NoError(t, err)
	args := append([]string{"migrate", "up", "--json"}, s...)
	_, errOut, code = cli(t, args...)
	require.Equal(t, exitError, code)
	require.Contains(t, jsonError(t, args, errOut, "schema_version", exitError), "newer than this library")
	args = append([]string{"migrate", "status", "--json"}, s...)
	_, errOut, code = cli(t, args...)
	require.Equal(t, exitError, code, "status of a schema newer than the binary says so")
	require.Contains(t, jsonError(t, args, errOut, "schema_version", exitError), "newer than this binary")
	for _, cmd := range [][]string{{"status"}, {"cancel", "1"}, {"retry", "1"}, {"prune", "--yes"}, {"pause", "q"}, {"run-now", "1"}} {
		args := append(append(cmd, "--json"), s...)
		_, errOut, code := cli(t, args...)
		require.Equal(t, exitError, code, "%v: %s", cmd, errOut)
		require.Contains(t, jsonError(t, args, errOut, "schema_version", exitError), "upgrade this gendurable")
	}
}

// TestMigrateDirectionIsCheckedUnderTheLock: `migrate up --to N` reads the
// installed version, finds it below N, then waits for the migration lock
// another migrator holds; that one moves the schema past N meanwhile. Up
// used to go on and move the schema down to N — dropping columns without
// the confirmation a down asks for (a probe: 19 → 17 in two of three
// rounds); it refuses now (exit 4, code conflict) and changes nothing.
// The same for `down --to N` overtaken below N: it moved up.
func TestMigrateDirectionIsCheckedUnderTheLock(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 3})
	ctx := context.Background()
	last := migrate.Latest()
	_, err := migrate.To(ctx, pool, schema, last-2)
	require.NoError(t, err)
	// overtake runs args while a transaction holding the schema's migration
	// lock sets the installed version to v (the version comment), once the
	// command waits for that lock; it returns the command's output and code.
	overtake := func(v int, args ...string) (string, int) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('gendurable.migrate.' || $1))`, schema)
		require.NoError(t, err)
		cmd := exec.Command(binary, append(append([]string{"migrate", "--json"}, args...), "--schema", schema)...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL())
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		require.Eventually(t, func() bool {
			var n int
			// This schema's migration lock (a bigint key: its high half in
			// classid, its low half in objid), not another test's.
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
				WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
				  AND ((classid::bigint << 32) | objid::bigint) = hashtext('gendurable.migrate.' || $1)::bigint`, schema).Scan(&n))
			return n > 0
		}, 15*time.Second, 10*time.Millisecond, "the command waits for the lock")
		_, err = tx.Exec(ctx, fmt.Sprintf(`COMMENT ON TABLE %s.gendurable_instances IS 'gendurable schema version %d'`,
			pgx.Identifier{schema}.Sanitize(), v))
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		err = cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out.String(), ee.ExitCode()
		}
		require.NoError(t, err)
		return out.String(), 0
	}
	comment := func() string {
		var c string
		require.NoError(t, pool.QueryRow(ctx, `SELECT obj_description($1::regclass, 'pg_class')`,
			pgx.Identifier{schema, "gendurable_instances"}.Sanitize()).Scan(&c))
		return c
	}

	// At last-2; up --to last-1 is overtaken to last.
	out, code := overtake(last, "up", "--to", strconv.Itoa(last-1))
	require.Equal(t, exitConflict, code, out)
	require.Contains(t, out, `"conflict"`)
	require.Contains(t, out, fmt.Sprintf("at version %d; moving only up to %d, nothing was applied", last, last-1))
	require.Equal(t, fmt.Sprintf("gendurable schema version %d", last), comment(), "nothing moved down")

	// At "last" (by its comment); down --to last-1 --yes is overtaken to last-2.
	out, code = overtake(last-2, "down", "--yes", "--to", strconv.Itoa(last-1))
	require.Equal(t, exitConflict, code, out)
	require.Contains(t, out, fmt.Sprintf("at version %d; moving only down to %d, nothing was applied", last-2, last-1))
	require.Equal(t, fmt.Sprintf("gendurable schema version %d", last-2), comment(), "nothing moved up")
}

// TestDatabaseSource: a connection error names where this run's URL came
// from: the flag if given (either spelling, with or without =), else
// DATABASE_URL if set, else the whole default chain; a "--database-url"
// after "--" is an argument, not the flag.
func TestDatabaseSource(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for args, want := range map[string]string{
		"status --database-url postgres://x":      "--database-url",
		"status -database-url=postgres://x":       "--database-url",
		"list --queue q":                          "",
		"signal 1 go -- --database-url":           "",
		"cancel --reason x --database-url=u -- y": "--database-url",
	} {
		require.Equal(t, want, databaseSource(strings.Fields(args)[1:]), args)
	}
	t.Setenv("DATABASE_URL", "postgres://y")
	require.Equal(t, "DATABASE_URL", databaseSource([]string{"--queue", "q"}))
	require.Equal(t, "--database-url", databaseSource([]string{"--database-url", "u"}))
}

// TestEveryFlagGivenTwiceIsAUsageError (a newcomer): the flag package keeps
// the last of a flag given twice, so `migrate down --to 20 --to 0 --yes`
// removed every table, and `--schema a --schema b` worked in b. Every flag
// of every command is a usage error given twice (exit 2, before any
// connection: nothing changes), a boolean one too.
func TestEveryFlagGivenTwiceIsAUsageError(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	for _, args := range [][]string{
		{"migrate", "down", "--to", "20", "--to", "0", "--yes"},
		{"migrate", "--to", "20", "down", "--to", "0", "--yes"},
		{"migrate", "up", "--schema", "other"},
		{"status", "--database-url", "postgres://nobody@127.0.0.1:1/x", "--database-url", dbtest.URL()},
		{"prune", "--retention", "1m", "--retention", "2m", "--yes"},
		{"list", "--limit", "5", "--limit", "6"},
		{"list", "--json", "--json"},
		{"cancel", "1", "--reason", "a", "--reason", "b"},
		{"show", "1", "--json", "--json"},
		{"ui", "--addr", "127.0.0.1:0", "--addr", "127.0.0.1:1"},
		{"demo", "--orders", "5", "--orders", "6"},
	} {
		_, errOut, code := cli(t, append(args, s...)...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, "given twice", "%q", args)
	}
	v, err := migrate.Installed(context.Background(), pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v, "nothing was migrated")

	// ui's --allowed-host is repeatable (a review: the first form refused
	// its second value), and --help still shows each flag's type and default
	// (the first form wrapped the values for good: every help printed
	// "panic calling String method" and lost its defaults).
	_, errOut, code := cli(t, "ui", "--allowed-host", "a.example", "--allowed-host", "b.example", "--addr", "127.0.0.1:0",
		"--trusted-origin", "https://a.example", "--trusted-origin", "https://b.example", // as its help says (a probe)
		"--database-url", "postgres://nobody@127.0.0.1:1/x")
	require.NotEqual(t, exitUsage, code, errOut)
	require.NotContains(t, errOut, "given twice")
	for _, c := range []string{"list", "status", "migrate", "prune", "ui", "demo", "bench", "cancel", "signal"} {
		out, errOut, code := cli(t, c, "--help")
		require.Zero(t, code, "%s --help: %s", c, errOut)
		require.NotContains(t, out+errOut, "panic calling", c)
	}
	out, _, _ := cli(t, "list", "--help")
	require.Contains(t, out, "(default 50)")
	require.Contains(t, out, "-limit int")
}

// TestVersion: `gendurable --version` answered "--version before the
// command: flags go after it (gendurable <command> --version …)", and no
// command took it (a newcomer's probe). It prints the version and the
// schema version the binary needs.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, errOut, code := cli(t, args...)
		require.Equal(t, exitOK, code, "%v: %s", args, errOut)
		require.Contains(t, out, fmt.Sprintf("schema version %d", migrate.Latest()), "%v", args)
	}
	out, _, code := cli(t, "version", "--json")
	require.Equal(t, exitOK, code)
	var v struct {
		SchemaVersion int `json:"schema_version"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Equal(t, migrate.Latest(), v.SchemaVersion)
	_, _, code = cli(t, "version", "extra")
	require.Equal(t, exitUsage, code)
}

// TestAnErrorOfSeveralLinesKeepsThemIndented: a message that quotes a
// program's output keeps its lines (it printed as one line of \x0a), each
// after the first indented, so that no text inside it — a database's
// message, a value echoed — reads as a line of the command's own.
func TestAnErrorOfSeveralLinesKeepsThemIndented(t *testing.T) {
	var b strings.Builder
	reportError(&b, "status", errors.New("start failed:\npostgres: FATAL: could not bind\ngendurable: retried 1 of 1\x1b[2J"), false, "")
	require.Equal(t, "gendurable: start failed:\n  | postgres: FATAL: could not bind\n  | gendurable: retried 1 of 1\\x1b[2J\n", b.String())
}

// TestALostConnectionSaysHowToCheck: a command whose connection went
// mid-way says its change may or may not have committed and how to check;
// for migrate, with `migrate status` (an upgrade probe: it said "show or
// list", which say nothing of the schema's version).
func TestALostConnectionSaysHowToCheck(t *testing.T) {
	lost := fmt.Errorf("migration 4 up: %w", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")})
	var b strings.Builder
	reportError(&b, "migrate", lost, false, "")
	require.Contains(t, b.String(), "`gendurable migrate status` says which version the schema is at; running it again goes on from there")
	require.NotContains(t, b.String(), "show or list")
	b.Reset()
	reportError(&b, "cancel", lost, false, "")
	require.Contains(t, b.String(), "check with show or list before running it again")
}

// TestAHugeArgumentIsNotEchoedWhole: an error that echoes its argument (an
// id, a schema, a command of 120 KB: a probe got 120 KB messages back) is
// cut in the middle, its start and its end kept.
func TestAHugeArgumentIsNotEchoedWhole(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("a", 120_000)
	for _, args := range [][]string{{"show", big}, {big}, {"status", "--schema", big}, {"migrate", "up", "--to", big}} {
		_, stderr, code := cli(t, args...)
		require.NotZero(t, code, args[0])
		require.Less(t, len(stderr), maxErrorBytes+200, "%.40s: %d bytes", strings.Join(args, " "), len(stderr))
		require.Contains(t, stderr, "bytes of this message cut", args[0])
		require.True(t, strings.HasPrefix(stderr, "gendurable: "), stderr[:80])
	}
	_, stderr, _ := cli(t, "show", "x")
	require.NotContains(t, stderr, "cut", "a short message is whole")
}

// TestIntegerFlagsAreDecimal: the flag package reads an integer as a Go
// literal — 020 as octal 16, 0x2 as 2, 1_0 as 10 — so `migrate down --to
// 020 --yes` removed versions 23 down to 16 (a hostile-operator probe).
// Every integer flag takes plain decimal now: anything else is exit 2,
// before any connection, and nothing is migrated.
func TestIntegerFlagsAreDecimal(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	for _, args := range [][]string{
		{"migrate", "down", "--to", "020", "--yes"},
		{"migrate", "down", "--to", "0x14", "--yes"},
		{"migrate", "down", "--to", "2_0", "--yes"},
		{"migrate", "down", "--to", "+20", "--yes"},
		{"list", "--limit", "010"},
		{"list", "--before", "0x10"},
		{"ui", "--max-conns", "010", "--addr", "127.0.0.1:0"},
		{"demo", "--orders", "010"},
	} {
		_, errOut, code := cli(t, append(args, "--schema", schema)...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, "want a whole number written in decimal", "%q", args)
	}
	v, err := migrate.Installed(context.Background(), pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v, "nothing was migrated")
	// Plain decimal, 0 and a negative number (refused by its own check)
	// still parse as numbers.
	_, errOut, code := cli(t, "list", "--limit", "-1", "--schema", schema)
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "--limit must be within")
	_, errOut, code = cli(t, "list", "--limit", "10", "--schema", schema)
	require.Zero(t, code, errOut)
}

// TestAnEmptyCredentialIsRefused: `ui --token "$UNSET"` (and --basic-auth,
// their -file forms, or GENDURABLE_UI_TOKEN set to nothing) served the
// dashboard with no authentication (a hostile-operator probe): each is exit
// 2 now, before the server starts.
func TestAnEmptyCredentialIsRefused(t *testing.T) {
	for _, flag := range []string{"--token=", "--basic-auth=", "--token-file=", "--basic-auth-file="} {
		_, errOut, code := cli(t, "ui", flag, "--addr", "127.0.0.1:0")
		require.Equal(t, exitUsage, code, "%s: %s", flag, errOut)
		require.Contains(t, errOut, "empty: give the credential", flag)
	}
	for _, env := range []string{envUIToken, envUIBasicAuth} {
		t.Setenv(env, "")
		var stdout, stderr strings.Builder
		code := run(context.Background(), []string{"ui", "--addr", "127.0.0.1:0", "--database-url", "postgres://nobody@127.0.0.1:1/x"}, &stdout, &stderr)
		require.Equal(t, exitUsage, code, "%s: %s", env, stderr.String())
		require.Contains(t, stderr.String(), env+" is set but empty", env)
		os.Unsetenv(env)
	}
}

// TestAConnectionStringIsNotRepeated: a database URL that does not parse
// is exit 2 with the reason, not the string: pgx masks the password it
// recognizes and missed one written "password = secret" (a
// hostile-operator probe found it in the message).
func TestAConnectionStringIsNotRepeated(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"host=h password = secretpw sslmode=bogus", "postgres://u:secretpw@h:99999/x"} {
		_, errOut, code := cli(t, "status", "--database-url", url)
		require.Equal(t, exitUsage, code, errOut)
		require.NotContains(t, errOut, "secretpw")
		require.Contains(t, errOut, "not shown: it may hold a password")
	}
}

// TestABulkActionByFilterSaysItWorksInBatches: a bulk retry over 60,000
// rows committed 500-row batches steadily, and after 5 s said it might be
// waiting on a row lock (an operator probe). A retry or cancel by filter,
// --all or --tree says it works in committed batches; one by ids keeps
// the plain note.
func TestABulkActionByFilterSaysItWorksInBatches(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]bool{
		"retry --all --yes":            true,
		"cancel --queue=q --yes":       true,
		"cancel --tree 5 --yes":        true,
		"retry 5 6":                    false,
		"cancel 5 --reason x -- --all": false,
		"signal 5 go --payload {}":     false,
		"retry -status failed --yes":   true,
	} {
		require.Equal(t, want, bulkByFilter(strings.Fields(args)), args)
	}
	for _, batches := range []bool{true, false} {
		var buf strings.Builder
		w := &syncWriter{w: &buf}
		stop := noteStillWaiting(w, "retry", false, 10*time.Millisecond, batches)
		require.Eventually(t, func() bool { w.mu.Lock(); defer w.mu.Unlock(); return buf.Len() > 0 }, 5*time.Second, 5*time.Millisecond)
		stop()
		require.Equal(t, batches, strings.Contains(buf.String(), "in batches of 500, each committed as it goes"), buf.String())
	}
}

// TestAPasswordTypedAsAnArgumentIsNotEchoed: migrate printed every word
// after an unexpected argument, a --database-url and its password among
// them; a --database-url given twice printed the second whole in its
// "given twice" error; a URL typed where the command goes was printed as
// the unknown command; and a password holding an '@' showed its tail as
// the host pgx could not resolve (an operator probe). None is repeated
// now; and migrate reads flags after an argument, as every command does.
func TestAPasswordTypedAsAnArgumentIsNotEchoed(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	const secret = "TopSecret99"
	url := "postgres://postgres:" + secret + "@127.0.0.1:1/postgres?sslmode=disable"
	for _, args := range [][]string{
		{"migrate", "up", "extra", "--database-url", url, "--schema", schema},
		{"migrate", "status", "--schema", schema, "extra", "--database-url", url, "--json"},
		{"migrate", "up", url},
		{"status", "--database-url", dbtest.URL(), "--database-url", url, "--schema", schema},
		{"status", "--database-url", url, "--database-url", url, "--json"},
		{url, "status"},
		{"help", url},
		{"show", url},
		{"list", "--database-url", "postgres://postgres:ab@cd-" + secret + "@127.0.0.1:1/postgres", "--schema", schema},
		{"list", "--database-url", "postgres://postgres:p@ss/" + secret + "@127.0.0.1:1/postgres", "--schema", schema},
		// The flag package's own messages, and values echoed by commands
		// (a review): each leaves the secret out.
		{"status", "---database-url=" + url},
		{"status", "--database-url:" + url},
		{"list", "--json=" + url},
		{"pause", url},
		{"list", "--status", url},
		{"ui", "--addr", url},
		{"migrate", "up", "--schema", url},
	} {
		out, errOut, code := cli(t, args...)
		require.NotZero(t, code, "%q: %s", args, errOut) // usage, or pause's unmigrated schema
		require.NotContains(t, out+errOut, secret, "%q", args)
	}
	// Flags after migrate's argument are read: this one finds the schema.
	out, errOut, code := cli(t, "migrate", "status", "--schema", schema, "--json")
	require.Zero(t, code, errOut)
	require.Contains(t, out, `"schema": "`+schema+`"`)
}

// TestAFlagMissingItsValueIsRefused: a flag that takes a value followed by
// another flag took that flag as its value — `signal 29 pay --dedup-key
// $ID --json` with ID empty sent a signal deduplicated on "--json" (every
// later one dropped as a duplicate) and printed text, not JSON (an
// operator probe). It is a usage error now, nothing sent; a value that
// starts with a dash is given as --flag=value.
func TestAFlagMissingItsValueIsRefused(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	for _, args := range [][]string{
		{"signal", "29", "pay", "--payload", `{}`, "--dedup-key", "--json"},
		{"cancel", "47999", "--reason", "--json"},
		{"list", "--queue", "--json"},
		{"list", "--queue", "-h"},
	} {
		out, errOut, code := cli(t, append(args, "--schema", schema)...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
		require.Contains(t, out+errOut, "has no value: the word after it", "%q", args)
	}
	// The refusal of a --json command line is JSON.
	_, errOut, _ := cli(t, "cancel", "5", "--reason", "--json", "--schema", schema)
	require.Contains(t, errOut, `"code": "usage"`)
	// --flag=value takes a value that starts with a dash; a negative
	// number is a value, not a flag.
	_, errOut, code := cli(t, "cancel", "47999", "--reason=--json", "--schema", schema)
	require.Equal(t, exitNotFound, code, errOut)
	_, errOut, code = cli(t, "list", "--limit", "-1", "--schema", schema)
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "--limit must be within")
}

// TestHelpOfAnUnknownCommandIsAUsageError: `gendurable help bogus` printed
// the general usage and exited 0 (an operator probe).
func TestHelpOfAnUnknownCommandIsAUsageError(t *testing.T) {
	t.Parallel()
	_, errOut, code := cli(t, "help", "bogus")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `unknown command "bogus"`)
	out, _, code := cli(t, "help", "list")
	require.Zero(t, code)
	require.Contains(t, out, "list")
	// A flag after help is no command: the usage, as before (a review).
	for _, args := range [][]string{{"help", "--json"}, {"help", "-h"}, {"--help", "--json"}} {
		out, errOut, code := cli(t, args...)
		require.Zero(t, code, "%q: %s", args, errOut)
		require.Contains(t, out, "commands:", "%q", args)
	}
	_, errOut, code = cli(t, "help", "bogus", "--json")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `"code": "usage"`)
}

// TestACommandCutOffFromTheDatabaseEndsOnCtrlC (a PgBouncer probe): a
// command whose statement waits on a server that stopped answering (a
// paused PgBouncer; here, a network cut under its connection) and is
// interrupted with Ctrl-C exits at once. Closing its pool waited for the
// cut connection's drain, up to 15 s, and Ctrl-C again did nothing.
func TestACommandCutOffFromTheDatabaseEndsOnCtrlC(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	seed(t, pool, schema, 1, "attempt", "0")
	u, err := url.Parse(dbtest.URL())
	require.NoError(t, err)
	proxy := dbtest.NewCutProxy(t, u.Host)
	u.Host = proxy.Addr()
	q := u.Query()
	q.Set("sslmode", "disable")
	q.Set("application_name", "gdctrlc_"+schema)
	u.RawQuery = q.Encode()

	// The show's statement waits on a lock this test holds.
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `LOCK TABLE "`+schema+`".gendurable_instances IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	cmd := exec.Command(binary, "show", "1", "--schema", schema)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+u.String())
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, "gdctrlc_"+schema).Scan(&n))
		return n > 0
	}, 20*time.Second, 20*time.Millisecond, "the command's statement did not wait on the lock")
	proxy.Cut()
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	start := time.Now()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%s", errOut.String())
		require.Equal(t, exitError, ee.ExitCode(), "%s", errOut.String())
		require.Contains(t, errOut.String(), "gendurable: show stopped: interrupt signal received")
		require.Less(t, time.Since(start), 5*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatalf("the command had not exited 10 s after Ctrl-C: %s", errOut.String())
	}
	_ = tx.Rollback(ctx)
	proxy.Heal()
}
