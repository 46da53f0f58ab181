package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/pgbouncer"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// seed inserts rows into schema's instances table: n rows with the given
// columns and values (SQL expressions; g is the row number).
func seed(t *testing.T, pool *pgxpool.Pool, schema string, n int, cols, vals string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO "`+schema+`".gendurable_instances (fsm, step, `+cols+`)
		SELECT 'm', 'a', `+vals+` FROM generate_series(1, $1::int) g`, n)
	require.NoError(t, err)
}

func countRows(t *testing.T, pool *pgxpool.Pool, schema, where string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+schema+`".gendurable_instances WHERE `+where).Scan(&n))
	return n
}

// auditLines returns the JSON audit lines of a --json run's stderr.
func auditLines(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "stderr line %q", line)
		out = append(out, m)
	}
	return out
}

// TestBulkRetryAndCancelByFilter (issue 14 item 6): retry and cancel by the
// filters of list, over more than two batches; off a terminal a filter needs
// --yes and, without it, changes nothing; the counts are printed (text or
// JSON) and the action is audit-logged on stderr with the user.
func TestBulkRetryAndCancelByFilter(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	const n = 2*gendurable.BulkBatch + 3
	seed(t, pool, schema, n, "queue, status, finished_at", "'q', 'failed', now()")
	seed(t, pool, schema, 4, "queue, status", "'q', 'runnable'")
	seed(t, pool, schema, 5, "queue, status, finished_at", "'other', 'failed', now()")

	_, errOut, code := cli(t, append([]string{"retry", "--queue", "q"}, s...)...)
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "pass --yes to confirm")
	require.Equal(t, n, countRows(t, pool, schema, "status = 'failed' AND queue = 'q'"), "nothing changed")

	out, errOut, code := cli(t, append([]string{"retry", "--queue", "q", "--yes", "--json"}, s...)...)
	require.Equal(t, 0, code, errOut)
	var res gendurable.BulkResult
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, int64(n+4), res.Matched)
	require.Equal(t, int64(n), res.Changed)
	require.Equal(t, int64(4), res.Skipped)
	require.Len(t, res.ChangedIDs, gendurable.MaxBulkIDs)
	require.True(t, res.Truncated)
	require.Zero(t, countRows(t, pool, schema, "status = 'failed' AND queue = 'q'"))
	require.Equal(t, 5, countRows(t, pool, schema, "status = 'failed' AND queue = 'other'"))
	lines := auditLines(t, errOut)
	require.Len(t, lines, 1)
	require.Equal(t, "gendurable: instances retried", lines[0]["msg"])
	require.Equal(t, "cli", lines[0]["via"])
	require.NotEmpty(t, lines[0]["user"])
	require.EqualValues(t, n, lines[0]["changed"])
	require.Equal(t, `queue="q"`, lines[0]["filter"])
	require.Len(t, lines[0]["changed_ids"], gendurable.MaxBulkIDs, "which instances, the first MaxBulkIDs")
	require.Equal(t, true, lines[0]["changed_ids_truncated"])

	out, errOut, code = cli(t, append([]string{"cancel", "--queue", "q", "--status", "runnable", "--yes", "--reason", "drain"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, fmt.Sprintf("cancelled %d of %d matching instances; 0 skipped (already finished)\n", n+4, n+4), out)
	require.Contains(t, errOut, `msg="gendurable: instances cancelled" via=cli user=`)
	require.Contains(t, errOut, `reason=drain`, "the audit line says why")
	require.Equal(t, n+4, countRows(t, pool, schema, `queue = 'q' AND errors -> -1 ->> 'error' = 'drain'`))

	// By ids: several ids act in bulk, missing ones are counted.
	out, _, code = cli(t, append([]string{"retry", "1", "2", "999999", "--json"}, s...)...)
	require.Equal(t, 0, code)
	require.JSONEq(t, `{"matched": 2, "changed": 2, "skipped": 0, "not_found": 1, "changed_ids": [1, 2]}`, out)
	out, errOut, code = cli(t, append([]string{"cancel", "1", "2", "3", "--json"}, s...)...)
	require.Equal(t, 0, code)
	require.JSONEq(t, `{"matched": 3, "changed": 2, "skipped": 1, "not_found": 0, "changed_ids": [1, 2]}`, out)
	lines = auditLines(t, errOut)
	require.Len(t, lines, 1)
	require.Equal(t, []any{1.0, 2.0}, lines[0]["changed_ids"], "the audit line names the instances cancelled")
	require.Equal(t, "cancelled from the CLI", lines[0]["reason"], "the CLI's default reason")

	// --all: every instance; the finished ones are skipped.
	out, _, code = cli(t, append([]string{"retry", "--all", "--yes", "--json"}, s...)...)
	require.Equal(t, 0, code)
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, int64(n+9), res.Changed)
}

// TestAnEmptyOrRepeatedFilterIsRefused (a hostile-input probe): an empty
// filter flag (an unset shell variable, --queue "$QUEUE") was read as "not
// given", so a bulk cancel meant for one queue failed every queue's
// instances; a filter given twice kept the last. Both are usage errors now,
// before any connection, and nothing changes.
func TestAnEmptyOrRepeatedFilterIsRefused(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	seed(t, pool, schema, 3, "queue, status", "'q1', 'awaiting_signal'")
	seed(t, pool, schema, 2, "queue, status", "'payments', 'awaiting_signal'")
	for _, args := range [][]string{
		{"cancel", "--queue", "", "--status", "awaiting_signal", "--yes"},
		{"cancel", "--queue=", "--status", "awaiting_signal", "--yes"},
		{"cancel", "--status", "awaiting_signal", "--machine", "", "--yes"},
		{"cancel", "--status", "awaiting_signal", "--step", "", "--yes"},
		{"cancel", "--status", "awaiting_signal", "--search", "", "--yes"},
		{"cancel", "--status", "", "--queue", "q1", "--yes"},
		{"cancel", "--status", "awaiting_signal", "--since", "0", "--yes"},
		{"cancel", "--queue", "q1", "--queue", "payments", "--yes"},
		{"retry", "--queue", "", "--yes"},
		{"list", "--queue", ""},
		// A signal's payload and dedup key too (a hostile probe: unset
		// variables sent a null payload with no dedup key, on every rerun).
		{"signal", "1", "go", "--payload", ""},
		{"signal", "1", "go", "--payload", "{}", "--dedup-key", ""},
		{"signal", "1", "go", "--payload", "1", "--payload", "2"},
		{"signal", "1", "go", "--dedup-key", "a", "--dedup-key", "b"},
	} {
		_, errOut, code := cli(t, append(args, s...)...)
		require.Equal(t, exitUsage, code, "%q: %s", args, errOut)
		require.Regexp(t, `empty: give a value|given twice|not above zero`, errOut, "%q", args)
	}
	require.Equal(t, 5, countRows(t, pool, schema, "status = 'awaiting_signal'"), "nothing was cancelled")
	// Search text with white space around it could find nothing (no id or
	// key has any): refused, as in the dashboard.
	_, errOut, code := cli(t, append([]string{"cancel", "--search", " 1", "--yes"}, s...)...)
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "white space")

	// A time range that leaves out nothing is refused in the command's
	// words: its flags, not the API's fields (From, All).
	_, errOut, code = cli(t, append([]string{"cancel", "--since", "100000h", "--yes"}, s...)...)
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "--since is not after")
	require.Contains(t, errOut, "pass --all to act")
	require.NotContains(t, errOut, "set All")

	// The filter as meant still works.
	out, errOut, code := cli(t, append([]string{"cancel", "--queue", "q1", "--status", "awaiting_signal", "--yes"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "cancelled 3 of 3")
	require.Equal(t, 2, countRows(t, pool, schema, "status = 'awaiting_signal' AND queue = 'payments'"))
}

// TestRunNowCLI: run-now makes a scheduled instance eligible now (exit 0),
// refuses a failed one (exit 4) and reports a missing one (exit 3).
func TestRunNowCLI(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	seed(t, pool, schema, 1, "eligible_at", "now() + interval '1 hour'")
	seed(t, pool, schema, 1, "status, finished_at", "'failed', now()")

	out, errOut, code := cli(t, append([]string{"run-now", "1"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "instance 1 is eligible now\n", out)
	require.Contains(t, errOut, `msg="gendurable: instance made eligible now" via=cli`)
	require.Equal(t, 1, countRows(t, pool, schema, "id = 1 AND eligible_at <= now()"))
	// Again: it was eligible already, and says so, not "is eligible now"
	// as of a change (an operator probe); no audit line for a no-op.
	out, errOut, code = cli(t, append([]string{"run-now", "1"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "instance 1 was eligible already: nothing changed\n", out)
	require.NotContains(t, errOut, "made eligible")
	_, errOut, code = cli(t, append([]string{"run-now", "2"}, s...)...)
	require.Equal(t, exitConflict, code)
	require.Equal(t, "gendurable: instance is not waiting to run: instance 2 is failed\n", errOut)
	_, errOut, code = cli(t, append([]string{"run-now", "3", "--json"}, s...)...)
	require.Equal(t, exitNotFound, code)
	jsonError(t, []string{"run-now", "3"}, errOut, "not_found", exitNotFound)
}

// TestCommandsRefuseASchemaWhoseTablesAreInherited: a table declared
// INHERITS gendurable_instances (an application's archive) has its rows
// taken in by every statement on the parent: a bulk retry revived an
// archived failed row (a probe). Every command refuses the schema before it
// reads or changes anything (exit 4, conflict), naming the table; the
// archive's row is untouched.
func TestCommandsRefuseASchemaWhoseTablesAreInherited(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	archive := `"` + schema + `_archive"`
	_, err := pool.Exec(context.Background(), `CREATE SCHEMA `+archive+`;
		CREATE TABLE `+archive+`.old_instances () INHERITS ("`+schema+`".gendurable_instances);
		INSERT INTO `+archive+`.old_instances (id, fsm, step, status, finished_at) VALUES (900002, 'billing', 'done', 'failed', now())`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA `+archive+` CASCADE`) })

	for _, cmd := range [][]string{{"retry", "--status", "failed", "--yes"}, {"list"}, {"status"}, {"retry", "900002"}, {"prune", "--yes"}, {"migrate", "up"}} {
		args := append(append(cmd, "--json"), s...)
		_, errOut, code := cli(t, args...)
		require.Equal(t, exitConflict, code, "%v: %s", cmd, errOut)
		require.Contains(t, jsonError(t, args, errOut, "conflict", exitConflict), "old_instances inherits from", "%v", cmd)
	}
	var status string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT status FROM `+archive+`.old_instances`).Scan(&status))
	require.Equal(t, "failed", status, "the archive's row was not revived")
}

// TestAttemptsShownFromOne: show and list count attempts from 1, the JSON
// from 0 (and list shows when a runnable instance scheduled later is due);
// an instance the reaper failed after its last lease (attempt =
// max attempts in the row) shows "3 of 3", as the dashboard does; one whose
// step replayed past its budget shows the run it is on ("6 of 3"), where it
// showed "3 of 3" before.
func TestAttemptsShownFromOne(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	seed(t, pool, schema, 1, "attempt, max_attempts, errors",
		`1, 3, '[{"step": "a", "attempt": 0, "at": "2026-01-01T00:00:00Z", "kind": "error", "error": "first"}]'`)
	seed(t, pool, schema, 1, "attempt, max_attempts, status, finished_at", "3, 3, 'failed', now()")
	seed(t, pool, schema, 1, "attempt, max_attempts", "5, 3")

	out, errOut, code := cli(t, append([]string{"show", "1"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "status   runnable at step a (attempt 2 of 3)\n")
	require.Contains(t, out, " step a attempt 1 [error] first\n")
	out, _, _ = cli(t, append([]string{"show", "2"}, s...)...)
	require.Contains(t, out, "status   failed at step a (attempt 3 of 3)\n")
	seed(t, pool, schema, 1, "eligible_at", "now() + interval '1 hour'")
	seed(t, pool, schema, 1, "eligible_at", "now() + interval '3 days'")
	out, _, _ = cli(t, append([]string{"list"}, s...)...)
	require.Regexp(t, `(?m)^1 .* runnable  +2/3 `, out, "eligible now: no due time")
	due := time.Now().Add(time.Hour).Local()
	if due.Day() == time.Now().Local().Day() {
		require.Regexp(t, `(?m)^4 .* runnable, due \d\d:\d\d:\d\d \S+  +\d+/\d+ `, out, "scheduled later today")
	}
	require.Regexp(t, `(?m)^5 .* runnable, due \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+  +\d+/\d+ `, out, "scheduled another day")
	require.Regexp(t, `(?m)^1 .* 2/3 `, out)
	require.Regexp(t, `(?m)^2 .* 3/3 `, out)
	require.Regexp(t, `(?m)^3 .* 6/3 `, out)
	out, _, _ = cli(t, append([]string{"show", "3"}, s...)...)
	require.Contains(t, out, "status   runnable at step a (attempt 6 of 3)\n")
	out, _, _ = cli(t, append([]string{"show", "1", "--json"}, s...)...)
	var d gendurable.InstanceDetail
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	require.Equal(t, 1, d.Attempt)
	require.Equal(t, 0, d.Errors[0].Attempt)
}

// TestShowPrintsPanicStack: show prints a panic's stack trace under its
// error, indented, escaped like every value (nothing in it can drive the
// terminal), each line and the number of lines bounded; show --json carries
// the whole trace as "stack".
func TestShowPrintsPanicStack(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	var stack strings.Builder
	stack.WriteString("goroutine 7 [running]:\nmain.step(\x1b]0;pwned\x07)\n\t/app/main.go:12 +0x1d\n")
	stack.WriteString("main.long(" + strings.Repeat("x", 500) + ")\n")
	for i := range 60 {
		fmt.Fprintf(&stack, "main.frame%d()\n\t/app/f.go:%d +0x1\n", i, i)
	}
	hist, err := json.Marshal([]gendurable.StepError{
		{Step: "a", Attempt: 0, Kind: "panic", Error: "panic: boom", Stack: stack.String()},
		{Step: "a", Attempt: 1, Kind: "error", Error: "plain"},
	})
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `INSERT INTO "`+schema+`".gendurable_instances (fsm, step, errors) VALUES ('m', 'a', $1)`, hist)
	require.NoError(t, err)

	out, errOut, code := cli(t, append([]string{"show", "1"}, s...)...)
	require.Equal(t, 0, code, errOut)
	requireInert(t, out)
	require.Contains(t, out, " step a attempt 1 [panic] panic: boom\n"+
		"stack    goroutine 7 [running]:\n"+
		"         main.step(\\x1b]0;pwned\\x07)\n"+
		"             /app/main.go:12 +0x1d\n"+
		"         main.long("+strings.Repeat("x", maxStackLineText-len("main.long("))+"…\n")
	require.Contains(t, out, fmt.Sprintf("         … %d more lines (show --json has the whole trace)\n", 4+2*60-maxStackLines))
	require.Equal(t, maxStackLines, strings.Count(out, "\n         "), "the stack's lines after its first (bounded) and the note")
	require.Contains(t, out, " step a attempt 2 [error] plain\n", "the next error follows")
	require.Equal(t, 1, strings.Count(out, "stack    "), "only the panic has a stack")

	out, _, code = cli(t, append([]string{"show", "1", "--json"}, s...)...)
	require.Equal(t, 0, code)
	var d struct {
		Errors []map[string]any `json:"errors"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	require.Equal(t, stack.String(), d.Errors[0]["stack"], "the whole trace, under the snake_case key stack")
	require.NotContains(t, d.Errors[1], "stack")
}

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// snakeKeys fails on any object key of v that is not snake_case, except
// inside user data (state, result, payload, inbox_by_name).
func snakeKeys(t *testing.T, cmd []string, path string, v any) {
	t.Helper()
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			require.Regexp(t, snakeCase, k, "%q: key %s.%s", cmd, path, k)
			switch k {
			case "state", "result", "payload", "inbox_by_name":
				continue
			}
			snakeKeys(t, cmd, path+"."+k, e)
		}
	case []any:
		for _, e := range x {
			snakeKeys(t, cmd, path+"[]", e)
		}
	}
}

// TestEveryJSONOutputIsSnakeCase (issue 14 item 6): one JSON convention for
// every command's --json output — snake_case names throughout (show's
// instance fields were Go's ID, Machine, ... before), arrays never null.
func TestEveryJSONOutputIsSnakeCase(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema, "--json"}
	seed(t, pool, schema, 1, "status, awaits, inbox", `'awaiting_signal', '{go}', '{"other": 1}'`)
	seed(t, pool, schema, 1, "status, finished_at", "'failed', now()")
	seed(t, pool, schema, 1, "eligible_at", "now() + interval '1 hour'")
	seed(t, pool, schema, 1, "status", "'runnable'")
	_, err := pool.Exec(context.Background(), `INSERT INTO "`+schema+`".gendurable_signals (target_id, name) VALUES (1, 'other')`)
	require.NoError(t, err)
	for _, args := range [][]string{
		// Before cancel and prune empty the table: "m" is only in the
		// instance table (no stored definition, so no version known).
		{"machines"}, {"machines", "m"},
		{"migrate", "status"}, {"status"}, {"list"}, {"show", "1"}, {"show", "2"}, {"signal", "1", "go", "--payload", `{"a":1}`},
		{"retry", "2"}, {"run-now", "3"}, {"cancel", "4"}, {"retry", "2", "4"}, {"cancel", "--all", "--yes"},
		{"pause", "default", "--create"}, {"resume", "default"}, {"prune", "--retention", "0s", "--yes"}, {"queue", "remove", "default"},
	} {
		args = append(args, s...)
		out, errOut, code := cli(t, args...)
		require.Equal(t, 0, code, "%q: %s", args, errOut)
		require.NotContains(t, out, "null", "%q: %s", args, out)
		var v any
		require.NoError(t, json.Unmarshal([]byte(out), &v), "%q: %s", args, out)
		snakeKeys(t, args, "", v)
		for _, line := range auditLines(t, errOut+"{}") {
			snakeKeys(t, args, "stderr", line)
		}
	}
}

// TestBulkByFilterAsksOnATerminal: on a terminal (script(1) gives the
// binary one), retry by filter asks first; "n" changes nothing (exit 1,
// "aborted"), "y" retries.
func TestBulkByFilterAsksOnATerminal(t *testing.T) {
	t.Parallel()
	scriptPath, err := exec.LookPath("script")
	if err != nil {
		t.Skip("script(1) is not installed")
	}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	seed(t, pool, schema, 3, "queue, status, finished_at", "'q', 'failed', now()")
	onTerminal := func(answer string) (string, int) {
		cmd := exec.Command(scriptPath, "-qec", binary+" retry --queue q --schema "+schema, "/dev/null")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL())
		cmd.Stdin = strings.NewReader(answer + "\n")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		require.NoError(t, err)
		return string(out), 0
	}
	out, code := onTerminal("n")
	require.Equal(t, exitError, code, out)
	require.Contains(t, out, `retry every failed instance matching queue="q"? [y/N]`)
	require.Contains(t, out, "gendurable: aborted: nothing changed")
	require.Equal(t, 3, countRows(t, pool, schema, "status = 'failed'"))
	out, code = onTerminal("y")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "retried 3 of 3 matching instances")
	require.Zero(t, countRows(t, pool, schema, "status = 'failed'"))
}

// TestRunNowAndRetryOfARowWaitingForItsCancelledStepsLease: a row cancelled
// mid-step keeps its lease; retried (or run now) while that lease lives it
// becomes eligible only when the lease ends. The CLI must not say it is
// eligible now, nor (for a retry) leave the wait unsaid.
func TestRunNowAndRetryOfARowWaitingForItsCancelledStepsLease(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	// 1: retried while its cancelled step's lease lives; 2: cancelled mid-step.
	seed(t, pool, schema, 1, "eligible_at, lease_expires_at", "now() + interval '1 hour', now() + interval '1 hour'")
	seed(t, pool, schema, 1, "status, finished_at, lease_expires_at", "'failed', now(), now() + interval '1 hour'")

	out, errOut, code := cli(t, append([]string{"run-now", "1"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "eligible now")
	require.Contains(t, out, "instance 1 becomes eligible when the lease of its cancelled step ends")
	require.NotContains(t, errOut, "made eligible now")
	out, errOut, code = cli(t, append([]string{"run-now", "1", "--json"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "becomes eligible when the lease of its cancelled step ends")

	out, errOut, code = cli(t, append([]string{"retry", "2"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "instance 2 is runnable again; it becomes eligible when the lease of its cancelled step ends")
	require.Equal(t, 1, countRows(t, pool, schema, "id = 2 AND status = 'runnable' AND eligible_at > now() + interval '59 minutes'"))
	// run-now cannot make it eligible before that lease ends, and says so.
	out, errOut, code = cli(t, append([]string{"run-now", "2"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "instance 2 becomes eligible when the lease of its cancelled step ends (at ")
	require.Contains(t, out, "not now: that step may still be running")

	// 3: a parent cancelled while a child of its fan-out (4) runs.
	seed(t, pool, schema, 1, "status, finished_at, fanout, children_total, children_pending", "'failed', now(), 1, 1, 1")
	seed(t, pool, schema, 1, "status, parent_id, parent_fanout", "'executing', 3, 1")
	out, errOut, code = cli(t, append([]string{"retry", "3"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "instance 3 awaits its live children again (0 of 1 finished)\n", out)
}

// TestCancelTreeCLI: cancel --tree ID cancels an instance and every live
// descendant, asks first (off a terminal it needs --yes, and without it
// changes nothing), prints the counts (text or JSON), is audit-logged, and
// exits 3 for an unknown id.
func TestCancelTreeCLI(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	// 1 awaits 2, 3 and 5 (done); 3 awaits 4; 6 is outside the tree.
	seed(t, pool, schema, 1, "status, fanout, children_total, children_pending", "'awaiting_children', 1, 3, 2")
	seed(t, pool, schema, 1, "status, parent_id, parent_fanout", "'runnable', 1, 1")
	seed(t, pool, schema, 1, "status, parent_id, parent_fanout, fanout, children_total, children_pending", "'awaiting_children', 1, 1, 1, 1, 1")
	seed(t, pool, schema, 1, "status, parent_id, parent_fanout", "'runnable', 3, 1")
	seed(t, pool, schema, 1, "status, parent_id, parent_fanout, finished_at", "'done', 1, 1, now()")
	seed(t, pool, schema, 1, "status", "'runnable'")

	_, errOut, code := cli(t, append([]string{"cancel", "--tree", "1"}, s...)...)
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "cancel instance 1 and every live descendant: pass --yes to confirm")
	require.Equal(t, 5, countRows(t, pool, schema, "status NOT IN ('done', 'failed')"), "nothing changed")

	out, errOut, code := cli(t, append([]string{"cancel", "--tree", "1", "--yes", "--reason", "tree drain"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "cancelled 4 of the 5 instances of the tree of 1; 1 skipped (already finished)\n", out)
	require.Contains(t, errOut, `msg="gendurable: instance tree cancelled" via=cli user=`)
	require.Contains(t, errOut, "root=1")
	require.Equal(t, 4, countRows(t, pool, schema, `id <= 4 AND status = 'failed' AND errors -> -1 ->> 'error' = 'tree drain'`))
	require.Equal(t, 1, countRows(t, pool, schema, `id = 6 AND status = 'runnable'`), "outside the tree")

	out, errOut, code = cli(t, append([]string{"cancel", "1", "--tree", "--yes", "--json"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"matched": 5, "changed": 0, "skipped": 5, "not_found": 0, "changed_ids": []}`, out)
	lines := auditLines(t, errOut)
	require.Len(t, lines, 1)
	require.Equal(t, "gendurable: instance tree cancelled", lines[0]["msg"])
	require.EqualValues(t, 1, lines[0]["root"])

	args := append([]string{"cancel", "--tree", "999", "--yes", "--json"}, s...)
	_, errOut, code = cli(t, args...)
	require.Equal(t, exitNotFound, code, errOut)
	jsonError(t, args, errOut, "not_found", exitNotFound)
}

// An empty --schema (an unset shell variable: --schema "$SCHEMA") is a usage
// error of every database command, before any connection: the library reads
// an empty schema as "public", so before, `cancel --all --yes --schema ""`
// cancelled every live instance of the public schema, and `ui --schema ""`
// served it. The database URL here has nothing listening: a command that
// connected would fail with exit 1, not 2.
func TestEmptySchemaIsRefusedBeforeAnyConnection(t *testing.T) {
	t.Parallel()
	nowhere := "postgres://postgres@127.0.0.1:1/none?connect_timeout=2"
	for _, cmd := range [][]string{
		{"status"}, {"list"}, {"show", "1"}, {"retry", "1"}, {"retry", "--all", "--yes"},
		{"cancel", "1", "2"}, {"cancel", "--all", "--yes"}, {"cancel", "--tree", "1", "--yes"},
		{"run-now", "1"}, {"signal", "1", "go"}, {"pause", "q", "--create"}, {"resume", "q", "--create"},
		{"queue", "remove", "q"}, {"prune", "--retention", "2h"}, {"machines"}, {"ui", "--addr", "127.0.0.1:0"},
		{"migrate", "up"}, {"migrate", "down", "--yes"}, {"migrate", "status"},
		// Their own schema by default, but not when given empty (a probe:
		// `demo --reset-schema --yes --schema "$UNSET"` ran on the default).
		{"demo", "--orders", "1"}, {"bench", "-n", "1"},
	} {
		for _, schema := range []string{"--schema=", "--schema= ", "--schema=\t"} {
			args := append(append([]string{}, cmd...), schema, "--database-url", nowhere, "--json")
			code, message := usageRefusal(t, args)
			require.Equal(t, "usage", code, "%q", args)
			require.Contains(t, message, "flag -schema: empty", "%q", args)
		}
	}
}

// databaseCommands are a command line of every command that takes a
// database.
var databaseCommands = [][]string{
	{"status"}, {"list"}, {"show", "1"}, {"retry", "--all", "--yes"}, {"cancel", "--all", "--yes"},
	{"run-now", "1"}, {"signal", "1", "go"}, {"pause", "q", "--create"}, {"queue", "remove", "q"},
	{"prune", "--retention", "2h"}, {"machines"}, {"ui", "--addr", "127.0.0.1:0"},
	{"migrate", "up"}, {"migrate", "down", "--yes"}, {"migrate", "status"}, {"demo"}, {"bench"},
}

// An empty --database-url (--database-url "$TARGET" with TARGET unset) is a
// usage error of every command that takes it, before any connection. It
// was read as unset: DATABASE_URL, else the local server (the demo: a
// throwaway server), so `migrate down --yes --database-url "$TARGET"` acted
// on a database the operator did not name.
func TestEmptyDatabaseURLIsRefusedBeforeAnyConnection(t *testing.T) {
	t.Parallel()
	for _, cmd := range databaseCommands {
		for _, url := range []string{"--database-url=", "--database-url= ", "--database-url=\t"} {
			args := append(append([]string{}, cmd...), url, "--json")
			if cmd[0] == "demo" {
				args = args[:len(args)-1] // demo has no --json
			}
			requireUsageError(t, args, "flag -database-url: empty")
		}
	}
}

// requireUsageError runs the command line args in this process and
// requires exit 2 with want in its message.
func requireUsageError(t *testing.T, args []string, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stdout, stderr strings.Builder
	code := run(ctx, args, &stdout, &stderr)
	require.Equal(t, exitUsage, code, "%q: %s", args, stderr.String())
	require.Contains(t, stderr.String(), want, "%q", args)
}

// TestEmptyDatabaseURLEnvIsRefusedBeforeAnyConnection: so is a
// DATABASE_URL set to nothing when no --database-url is given
// (DATABASE_URL="$TARGET" with TARGET unset): it was read as unset, and
// `status` connected to the local server, saying neither was set (a
// newcomer's probe); the demo started a throwaway server in place of the
// database meant. A --database-url still wins over it.
func TestEmptyDatabaseURLEnvIsRefusedBeforeAnyConnection(t *testing.T) {
	for _, env := range []string{"", " "} {
		t.Setenv("DATABASE_URL", env)
		for _, cmd := range databaseCommands {
			requireUsageError(t, cmd, "DATABASE_URL is set but empty")
		}
	}
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"migrate", "status", "--database-url", dbtest.URL(), "--schema", "gd_nothing_here"}, &stdout, &stderr)
	require.NotContains(t, stderr.String(), "DATABASE_URL is set but empty", "code %d", code)
}

// TestDoubleDashEndsTheFlags: after "--" every argument is positional,
// however it looks. The CLI parsed flags again after the first positional
// argument that followed "--", so `cancel -- ID --tree --yes` — ids from a
// script, the last of which came from data — cancelled ID and every live
// descendant, and `signal -- ID -pay` could not send a signal named
// "-pay". Now the first is three ids, refused (exit 2, nothing changed),
// and the second sends "-pay". A "--" that is a flag's value still ends
// nothing.
func TestDoubleDashEndsTheFlags(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	seed(t, pool, schema, 1, "queue, status, awaits", "'q', 'awaiting_signal', ARRAY['-pay']")
	var parent int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT min(id) FROM "`+schema+`".gendurable_instances`).Scan(&parent))
	seed(t, pool, schema, 2, "queue, status, parent_id", fmt.Sprintf("'q', 'runnable', %d", parent))
	id := fmt.Sprint(parent)

	_, errOut, code := cli(t, "cancel", "--schema", schema, "--", id, "--tree", "--yes")
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, `"--tree" is not an instance id`)
	require.Zero(t, countRows(t, pool, schema, "status = 'failed'"), "nothing was cancelled")

	out, errOut, code := cli(t, "signal", "--schema", schema, "--", id, "-pay")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "woke up")
	var name string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT name FROM "`+schema+`".gendurable_signals`).Scan(&name))
	require.Equal(t, "-pay", name)

	// "--" as a flag's value is a value; the flags after it are flags.
	out, errOut, code = cli(t, "cancel", "--schema", schema, "--reason", "--", id, "--json")
	require.Equal(t, 0, code, errOut)
	require.True(t, json.Valid([]byte(out)), out)
	require.Equal(t, 1, countRows(t, pool, schema, "status = 'failed' AND errors::text LIKE '%\"--\"%'"), "cancelled with the reason \"--\"")
}

// TestACommandWaitingOnALockSaysSo: an operator command whose statement
// waits on a row another transaction holds locked says so on stderr after
// five seconds (it used to wait without a word: 44 s in a review), and
// still does its work once the lock goes; a command that is quick says
// nothing.
func TestACommandWaitingOnALockSaysSo(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	seed(t, pool, schema, 1, "queue, status", "'q', 'runnable'")
	s := []string{"--schema", schema}
	_, errOut, code := cli(t, append([]string{"cancel", "1"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, errOut, "still waiting")
	seed(t, pool, schema, 1, "queue, status", "'q', 'runnable'")

	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM "`+schema+`".gendurable_instances WHERE id = 2 FOR UPDATE`)
	require.NoError(t, err)
	type result struct {
		errOut string
		code   int
	}
	done := make(chan result, 1)
	go func() {
		_, errOut, code := cli(t, append([]string{"cancel", "2"}, s...)...)
		done <- result{errOut, code}
	}()
	select {
	case r := <-done:
		t.Fatalf("the cancel returned while the row was locked: %d %s", r.code, r.errOut)
	case <-time.After(stillWaitingAfter + 1500*time.Millisecond):
	}
	require.NoError(t, tx.Rollback(ctx))
	r := <-done
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.errOut, "gendurable: cancel: still waiting on the database after 5s")
	require.Equal(t, 1, strings.Count(r.errOut, "still waiting"), "said once: %s", r.errOut)
	require.Equal(t, 1, countRows(t, pool, schema, "id = 2 AND status = 'failed'"), "cancelled once the lock went")
}

// TestAConnectionLostMidCommandIsItsOwnCode: a command whose session dies
// mid-statement (a restart, a terminated backend, a network cut) exits 1
// with code connection_lost, and a command that changes something says
// its change may or may not have been committed. It was code "error" with
// the server's "terminating connection due to administrator command" and
// nothing else: an operator could read it as "nothing happened".
func TestAConnectionLostMidCommandIsItsOwnCode(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 3})
	seed(t, pool, schema, 1, "queue, status", "'q', 'runnable'")
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM "`+schema+`".gendurable_instances WHERE id = 1 FOR UPDATE`)
	require.NoError(t, err)
	type result struct {
		errOut string
		code   int
	}
	done := make(chan result, 1)
	go func() {
		_, errOut, code := cli(t, "cancel", "1", "--schema", schema, "--json")
		done <- result{errOut, code}
	}()
	// The command's session, waiting on the row's lock: terminated.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND query LIKE '%' || $1 || '%'`, schema).Scan(&n))
		if n > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the cancel's statement never waited on the lock")
		time.Sleep(20 * time.Millisecond)
	}
	r := <-done
	msg := jsonError(t, []string{"cancel"}, r.errOut, "connection_lost", exitError)
	require.Contains(t, msg, "may or may not have been committed")
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 1, countRows(t, pool, schema, "id = 1 AND status = 'runnable'"), "the terminated statement changed nothing")
}

// TestAStatementPoolingRefusalIsCannotConnect: behind PgBouncer in
// statement pooling a retry's transaction is refused, and nothing of it
// committed: code cannot_connect with the pooler's advice, not
// connection_lost with "may or may not have been committed" (a PgBouncer
// probe).
func TestAStatementPoolingRefusalIsCannotConnect(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	seed(t, pool, schema, 1, "queue, status, finished_at", "'q', 'failed', now()")
	b := pgbouncer.StartWith(t, dbtest.URL(), pgbouncer.Options{PoolMode: "statement"})
	_, errOut, _ := cli(t, "retry", "1", "--schema", schema, "--json",
		"--database-url", b.URL+"&default_query_exec_mode=cache_describe")
	msg := jsonError(t, []string{"retry"}, errOut, "cannot_connect", exitError)
	require.Contains(t, msg, "statement pooling")
	require.NotContains(t, msg, "committed")
	require.Equal(t, 1, countRows(t, pool, schema, "id = 1 AND status = 'failed'"))
}

// TestShowSaysItsListsWereCut: show prints the first 500 children and the
// newest 100 signals, and a line saying there are more (it printed 500
// child lines of 600 with no word).
func TestShowSaysItsListsWereCut(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	seed(t, pool, schema, 1, "status", "'awaiting_children'")
	seed(t, pool, schema, 501, "parent_id, parent_fanout", "1, 0")
	_, err := pool.Exec(context.Background(), `INSERT INTO "`+schema+`".gendurable_signals (target_id, name) SELECT 1, 'n' FROM generate_series(1, 101)`)
	require.NoError(t, err)
	out, errOut, code := cli(t, append([]string{"show", "1"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, 500, strings.Count(out, "\nchild    ")-1, "500 children and the line saying there are more")
	require.Contains(t, out, "child    … more not shown (the first 500 are)\n")
	require.Contains(t, out, "signal   … older ones not shown (the newest 100 are)\n")
	out, _, _ = cli(t, append([]string{"show", "2"}, s...)...)
	require.NotContains(t, out, "not shown")
}

// TestRetryOfACancelledWaitSaysItWaits: a row cancelled while it slept
// (a RunAt, Next(…).After, a backoff) keeps the wait when retried; the CLI
// says so, and how to end it, rather than only "runnable again" (a
// review).
func TestRetryOfACancelledWaitSaysItWaits(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	s := []string{"--schema", schema}
	seed(t, pool, schema, 1, "status, finished_at, eligible_at", "'failed', now(), now() + interval '1 hour'")
	out, errOut, code := cli(t, append([]string{"retry", "1"}, s...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "instance 1 is runnable again, but sleeping until ")
	require.Contains(t, out, "as when it was cancelled (gendurable run-now 1 runs it now)")
	require.Equal(t, 1, countRows(t, pool, schema, "id = 1 AND status = 'runnable' AND eligible_at > now() + interval '59 minutes'"))
}

// TestABulkFilterIsCheckedBeforeItIsConfirmed: a bulk retry or cancel by a
// filter the library refuses (a queue name with white space around it)
// asked for --yes (or y/N on a terminal) first, and refused only after;
// the refusal named "list", not the action (an operator probe). The filter
// is checked first now; the library's bulk actions name themselves.
func TestABulkFilterIsCheckedBeforeItIsConfirmed(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	for _, cmd := range []string{"retry", "cancel"} {
		_, errOut, code := cli(t, cmd, "--queue", " default", "--schema", schema)
		require.Equal(t, exitUsage, code, errOut)
		require.Contains(t, errOut, `queue " default" starts with white space`, cmd)
		require.NotContains(t, errOut, "--yes", cmd)
	}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema})
	require.NoError(t, err)
	_, err = eng.RetryMatching(context.Background(), gendurable.ListFilter{Queue: " default"})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
	require.ErrorContains(t, err, `retry: queue " default"`)
	require.NoError(t, gendurable.ListFilter{Queue: "default"}.Validate())
}

// TestBulkCountsBeforeAnErrorSaySo: a bulk command stopped by an error
// prints the counts of the batches before it as such: "cancelled 500 of
// 500 matching instances" read as the whole of a larger match (an
// operator probe).
func TestBulkCountsBeforeAnErrorSaySo(t *testing.T) {
	var b strings.Builder
	err := errors.New("connection lost")
	got := printBulk(&b, false, gendurable.BulkResult{Matched: 500, Changed: 500}, err, "cancelled 500 of 500 matching instances; 0 skipped (already finished)")
	require.Equal(t, err, got)
	require.Equal(t, "before the error: cancelled 500 of 500 matching instances; 0 skipped (already finished); the rest was not visited\n", b.String())
	b.Reset()
	require.NoError(t, printBulk(&b, false, gendurable.BulkResult{Matched: 2, Changed: 2}, nil, "cancelled 2 of 2 matching instances"))
	require.Equal(t, "cancelled 2 of 2 matching instances\n", b.String())
}

// A name or filter the library refuses for its text (white space around
// it, a control or bidirectional character, empty) is exit 2 before any
// connection, as README's "CLI" says ("validated … before any SQL runs").
// list, signal, pause, resume, queue remove and machines read the schema's
// version first: with the database down such a command was exit 1,
// cannot_connect (not_migrated on a schema never migrated), while the bulk
// retry and cancel, which validate their filter first, were exit 2. The
// database URL here has nothing listening: a command that connected would
// fail with exit 1, not 2.
func TestInvalidNamesAreRefusedBeforeAnyConnection(t *testing.T) {
	t.Parallel()
	nowhere := "postgres://postgres@127.0.0.1:1/none?connect_timeout=2"
	for _, cmd := range [][]string{
		{"list", "--queue", " default"}, {"list", "--search", " 7"}, {"list", "--machine", "order\u202e"},
		{"list", "--step", "ship\x01"},
		{"signal", "7", " pay"}, {"signal", "7", "pay\u202e"}, {"signal", "7", ""},
		{"signal", "7", "pay", "--dedup-key", "evt-1 "}, {"signal", "7", "pay", "--dedup-key", "evt\x00"},
		{"pause", " default"}, {"resume", "default ", "--create"}, {"pause", ""},
		{"queue", "remove", "q\x1b"}, {"machines", " order"},
		// Those that did so already.
		{"cancel", "--queue", " default", "--yes"}, {"retry", "--search", " 7", "--yes"},
	} {
		args := append(append([]string{}, cmd...), "--database-url", nowhere, "--json")
		code, message := usageRefusal(t, args)
		require.Equal(t, "invalid_input", code, "%q: %s", args, message)
	}
}

// usageRefusal runs the command line args (with --json) in-process, checks
// that it exits 2 and prints nothing on stdout, and returns its JSON
// error's code and message.
func usageRefusal(t *testing.T, args []string) (code, message string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stdout, stderr strings.Builder
	require.Equal(t, exitUsage, run(ctx, args, &stdout, &stderr), "%q: %s", args, stderr.String())
	var e struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.Unmarshal([]byte(stderr.String()), &e), "%q: %s", args, stderr.String())
	require.Empty(t, stdout.String(), "%q", args)
	return e.Error.Code, e.Error.Message
}
