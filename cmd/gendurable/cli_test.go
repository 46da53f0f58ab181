package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
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
	require.Contains(t, out, "version 0 → 6")
	out, _, code = cli(t, append([]string{"migrate", "status", "--json"}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"to":6`)
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
	out, _, code = cli(t, append([]string{"prune", "--retention", "24h"}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "deleted 3 instances")

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
	require.Regexp(t, `done in .*: \d+ checkouts paid and shipped .*, \d+ timed out waiting for payment`, string(out))
}

func TestUIServesTheDashboardOnLoopback(t *testing.T) {
	t.Parallel()
	_, schema := dbtest.NewSchema(t, nil)
	_, errOut, code := cli(t, "ui", "--schema", schema, "--addr", "0.0.0.0:0")
	require.Equal(t, exitUsage, code, "beyond loopback without auth is refused: %s", errOut)

	cmd := exec.Command(binary, "ui", "--schema", schema, "--addr", "127.0.0.1:0", "--token", "s3cret")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL())
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	buf := make([]byte, 256)
	n, err := stdout.Read(buf)
	require.NoError(t, err)
	line := string(buf[:n])
	require.Contains(t, line, "dashboard on http://127.0.0.1:")
	url := strings.TrimSpace(strings.TrimSuffix(strings.Fields(line)[2], "/"))
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
		{"list", "--status", "nope"},
		{"pause", "\xff"},
		{"resume", "\t"},
		{"pause", "a\x7fb"},
	} {
		_, errOut, code := cli(t, append(args, "--schema", schema)...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, "invalid input", "%q", args)
		require.NotContains(t, errOut, "SQLSTATE", "%q", args)
	}
}

// lockedBuffer collects a process's output while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startUI runs `gendurable ui` with extra environment and returns its base
// URL and its stderr; the process is killed at cleanup.
func startUI(t *testing.T, env []string, args ...string) (string, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"ui", "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+dbtest.URL()), env...)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "stderr: %s", stderr)
	require.Contains(t, line, "dashboard on http://127.0.0.1:")
	return strings.TrimSuffix(strings.Fields(line)[2], "/"), stderr
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
	} {
		cmd := exec.Command(binary, append([]string{"ui", "--schema", schema}, c.args...)...)
		cmd.Env = append(append(os.Environ(), "DATABASE_URL="+dbtest.URL()), c.env...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v %v: %s", c.env, c.args, out)
		require.Equal(t, exitUsage, ee.ExitCode(), "%v %v: %s", c.env, c.args, out)
		require.Contains(t, string(out), c.want, "%v %v", c.env, c.args)
	}

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
}
