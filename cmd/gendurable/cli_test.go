package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	require.Contains(t, out, "version 0 → 4")
	out, _, code = cli(t, append([]string{"migrate", "status", "--json"}, s...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"to":4`)
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
