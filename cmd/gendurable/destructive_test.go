package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// scratchName is a schema name no other test uses, dropped when t ends.
func scratchName(t *testing.T, pool *pgxpool.Pool, prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+name+`" CASCADE`) })
	return name
}

func schemaComment(t *testing.T, pool *pgxpool.Pool, schema string) *string {
	var c *string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1`, schema).Scan(&c))
	return c
}

func schemaExists(t *testing.T, pool *pgxpool.Pool, schema string) bool {
	var ok bool
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&ok))
	return ok
}

// TestDemoAndBenchNeverDropASchemaTheyDidNotCreate: `demo --schema victim`
// and `bench --schema victim` once dropped a schema with live instances in
// it. Now a schema they did not create — gendurable's tables with a live
// row, or anyone's table — is refused (exit 2) and survives untouched; the
// schemas they create are marked and theirs to recreate; --reset-schema is
// the explicit way to drop one that is not and holds gendurable's objects
// alone. A schema with anyone's table in it is refused even then (a probe:
// --reset-schema --yes dropped public with a user's tables), its message
// naming the table and suggesting no flag.
func TestDemoAndBenchNeverDropASchemaTheyDidNotCreate(t *testing.T) {
	t.Parallel()
	pool, victim := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO "`+victim+`".gendurable_instances (fsm, step) VALUES ('order', 'charge')`)
	require.NoError(t, err)
	users := scratchName(t, pool, "gdusers_")
	_, err = pool.Exec(ctx, `CREATE SCHEMA "`+users+`"; CREATE TABLE "`+users+`".accounts (id int); INSERT INTO "`+users+`".accounts VALUES (1)`)
	require.NoError(t, err)
	rows := func(table string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		return n
	}

	for _, cmd := range [][]string{{"demo", "--orders", "5"}, {"bench", "-n", "20"}} {
		_, errOut, code := cli(t, append(cmd, "--schema", victim)...)
		require.Equal(t, exitUsage, code, "%s --schema %s: %s", cmd[0], victim, errOut)
		require.Contains(t, errOut, "was not created by gendurable "+cmd[0])
		require.Contains(t, errOut, "--reset-schema")
		for _, reset := range [][]string{nil, {"--reset-schema", "--yes"}} {
			_, errOut, code = cli(t, append(append(cmd, "--schema", users), reset...)...)
			require.Equal(t, exitUsage, code, "%s --schema %s %v: %s", cmd[0], users, reset, errOut)
			require.Contains(t, errOut, `holds an object that gendurable did not create (table `+users+`.accounts)`)
			require.NotContains(t, errOut, "--reset-schema", "a flag that cannot help")
		}
		require.Equal(t, 1, rows(`"`+victim+`".gendurable_instances`), "%s left the victim's live row alone", cmd[0])
		require.Equal(t, 1, rows(`"`+users+`".accounts`))
	}

	// A schema the demo creates is marked, and a second run may recreate it.
	mine := scratchName(t, pool, "gddemo_")
	for range 2 {
		out, errOut, code := cli(t, "demo", "--orders", "5", "--schema", mine)
		require.Equal(t, 0, code, "%s%s", out, errOut)
		require.Regexp(t, `checkouts? paid and shipped`, out)
	}
	require.NotNil(t, schemaComment(t, pool, mine))
	require.True(t, strings.HasPrefix(*schemaComment(t, pool, mine), "gendurable scratch schema"))
	// bench may reuse the demo's scratch schema, and drops it when done.
	out, errOut, code := cli(t, "bench", "-n", "20", "--schema", mine)
	require.Equal(t, 0, code, "%s%s", out, errOut)
	require.False(t, schemaExists(t, pool, mine))

	// --reset-schema off a terminal needs --yes too (a hostile-input probe:
	// it dropped someone's schema with no confirmation); without it
	// nothing changes.
	for _, cmd := range []string{"demo", "bench"} {
		_, errOut, code = cli(t, cmd, "--schema", victim, "--reset-schema")
		require.Equal(t, exitUsage, code, "%s: %s", cmd, errOut)
		require.Contains(t, errOut, "pass --yes")
		require.Equal(t, 1, rows(`"`+victim+`".gendurable_instances`), "%s --reset-schema without --yes dropped the schema", cmd)
	}
	out, errOut, code = cli(t, "bench", "-n", "20", "--schema", victim, "--reset-schema", "--yes")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	require.False(t, schemaExists(t, pool, victim), "reset on request, then dropped as bench's own")
	require.Equal(t, 1, rows(`"`+users+`".accounts`))
}

// TestDemoAndBenchKeepWhatOthersAddedToTheirSchema: a schema demo or bench
// created is theirs to recreate, but not what someone added since — a table
// of theirs inside it, or a view elsewhere reading its instances: a rerun
// that would drop them (DROP SCHEMA ... CASCADE took both) is refused like
// any schema they did not create, and changes nothing.
func TestDemoAndBenchKeepWhatOthersAddedToTheirSchema(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, NoMigrate: true})
	ctx := context.Background()
	mine := scratchName(t, pool, "gddemo_")
	out, errOut, code := cli(t, "demo", "--orders", "5", "--schema", mine)
	require.Equal(t, 0, code, "%s%s", out, errOut)
	views := scratchName(t, pool, "gdviews_")
	_, err := pool.Exec(ctx, `CREATE SCHEMA "`+views+`"; CREATE VIEW "`+views+`".demo_done AS
		SELECT id FROM "`+mine+`".gendurable_instances WHERE status = 'done'`)
	require.NoError(t, err)
	exists := func(rel string) bool {
		var ok bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, rel).Scan(&ok))
		return ok
	}
	for _, cmd := range [][]string{{"demo", "--orders", "5"}, {"bench", "-n", "20"}} {
		_, errOut, code := cli(t, append(cmd, "--schema", mine)...)
		require.Equal(t, exitUsage, code, "%s: a view elsewhere reads the schema: %s", cmd[0], errOut)
		require.Contains(t, errOut, "--reset-schema")
		require.True(t, exists(`"`+views+`".demo_done`), "%s dropped a view it did not create", cmd[0])
	}
	_, err = pool.Exec(ctx, `DROP VIEW "`+views+`".demo_done; CREATE TABLE "`+mine+`".notes (id int); INSERT INTO "`+mine+`".notes VALUES (1)`)
	require.NoError(t, err)
	for _, cmd := range [][]string{{"demo", "--orders", "5"}, {"bench", "-n", "20"}} {
		_, errOut, code := cli(t, append(cmd, "--schema", mine)...)
		require.Equal(t, exitUsage, code, "%s: a table of someone's is in the schema: %s", cmd[0], errOut)
		require.True(t, exists(`"`+mine+`".notes`), "%s dropped a table it did not create", cmd[0])
		require.True(t, exists(`"`+mine+`".gendurable_instances`), "%s changed the schema it refused", cmd[0])
	}
}

// TestMigrateDownAsksFirst: off a terminal `migrate down` refuses without
// --yes (exit 2) and drops nothing; with --yes it drops the tables.
func TestMigrateDownAsksFirst(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('order', 'charge')`)
	require.NoError(t, err)

	_, errOut, code := cli(t, "migrate", "down", "--schema", schema)
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "pass --yes to confirm")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances`).Scan(&n))
	require.Equal(t, 1, n)

	out, errOut, code := cli(t, "migrate", "down", "--yes", "--schema", schema)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "→ 0")
	out, _, code = cli(t, "migrate", "down", "--schema", schema)
	require.Equal(t, 0, code, "nothing left to drop: no confirmation needed")
	require.Contains(t, out, "version 0 → 0")
	require.Contains(t, out, "no gendurable tables in schema "+schema+" (is --schema right?)", "a no-op says why")
	out, _, code = cli(t, "migrate", "status", "--schema", schema+"_misspelt")
	require.Equal(t, 0, code)
	require.Equal(t, fmt.Sprintf("schema %s_misspelt: version 0 (latest %d): no gendurable tables in schema %s_misspelt (is --schema right?)\n",
		schema, migrate.Latest(), schema), out)
}

// TestAMigrateStoppedPartWayIsAuditLogged: the versions a migrate committed
// before an error changed the schema all the same, so they are on the audit
// trail (a warning with the error) — before, only the error was printed.
// An index of the user's named as one of version 14's stops the upgrade
// from 9 after it committed 10 to 13.
func TestAMigrateStoppedPartWayIsAuditLogged(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	schema := scratchName(t, pool, "gdpartial_")
	_, errOut, code := cli(t, "migrate", "up", "--to", "9", "--schema", schema)
	require.Equal(t, 0, code, errOut)
	_, err := pool.Exec(ctx, `CREATE TABLE "`+schema+`".mine (x int);
		CREATE INDEX gendurable_instances_lingering_leases ON "`+schema+`".mine (x)`)
	require.NoError(t, err)
	_, errOut, code = cli(t, "migrate", "up", "--schema", schema)
	require.NotEqual(t, 0, code, errOut)
	require.Contains(t, errOut, `msg="gendurable: schema migrated part way" via=cli user=`)
	require.Contains(t, errOut, "schema="+schema+" from=9 to=13 applied=\"[10 11 12 13]\" err=")
}

// TestPrompt: y or yes confirms, anything else does not; the question is
// shown inert, and where the prompt went is not the terminal the answer
// echoes on, its line is ended after the answer — before, with --json the
// error followed the prompt on one line (an operator probe).
func TestPrompt(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{"y\n": true, "YES\n": true, " yes ": true, "\n": false, "": false, "n\n": false, "yep\n": false} {
		var out strings.Builder
		ok, err := prompt(context.Background(), strings.NewReader(in), &out, "drop \x1b[2J?")
		require.NoError(t, err)
		require.Equal(t, want, ok, "%q", in)
		require.Equal(t, "drop \\x1b[2J? [y/N] \n", out.String())
	}
}

// TestAnInterruptEndsAPrompt: Ctrl-C or SIGTERM (the context main cancels
// on either) ends a confirmation prompt that no line has answered, as a no
// does: errAborted (code "aborted"), its cause named. Before, the read
// ignored them: the command sat at the prompt, under a supervisor or
// `timeout` too, until a line came (a probe: only kill -9 ended it).
func TestAnInterruptEndsAPrompt(t *testing.T) {
	t.Parallel()
	in, typing := io.Pipe() // a terminal no one types on
	t.Cleanup(func() { _ = typing.Close() })
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(50*time.Millisecond, func() { cancel(errors.New("interrupt signal received")) })
	var out syncbuf.Buffer
	start := time.Now()
	ok, err := prompt(ctx, in, &out, "cancel every live instance?")
	require.False(t, ok)
	require.ErrorContains(t, err, "interrupt signal received")
	require.ErrorIs(t, err, errAborted)
	require.Equal(t, "aborted", errorCode(err))
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, "cancel every live instance? [y/N] \n", out.String())
}

// TestSchemaChangesAreAuditLogged: every mutation leaves a line on stderr
// with via=cli and the operating-system user — the schema changes too.
// Before, `migrate up` and `migrate down --yes` (which drops every
// instance) and a `--reset-schema --yes` drop of a schema holding someone's
// table printed their result on stdout and nothing on the audit trail. A
// migrate that changes nothing, and the drop of a command's own scratch
// schema, are not mutations of anyone's data and stay quiet.
func TestSchemaChangesAreAuditLogged(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	schema := scratchName(t, pool, "gdaudit_")

	_, errOut, code := cli(t, "migrate", "up", "--schema", schema)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, `msg="gendurable: schema migrated" via=cli user=`)
	require.Contains(t, errOut, "schema="+schema+" from=0 to=")
	_, errOut, code = cli(t, "migrate", "up", "--schema", schema)
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut, "nothing applied, nothing logged")
	_, errOut, code = cli(t, "migrate", "down", "--yes", "--json", "--schema", schema)
	require.Equal(t, 0, code, errOut)
	var line struct{ Msg, Via, User, Schema string }
	// The last line: on a loaded machine a down of over 5 s says first
	// that it is still waiting.
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &line), errOut)
	require.Equal(t, "gendurable: schema migrated", line.Msg)
	require.Equal(t, "cli", line.Via)
	require.NotEmpty(t, line.User)
	require.Equal(t, schema, line.Schema)
	require.Contains(t, errOut, `"to":0`)

	// The explicit reset of a schema the command did not create.
	_, errOut, code = cli(t, "migrate", "up", "--schema", schema)
	require.Equal(t, 0, code, errOut)
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('order', 'charge')`)
	require.NoError(t, err)
	_, errOut, code = cli(t, "demo", "--orders", "1", "--schema", schema, "--reset-schema", "--yes")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, `msg="gendurable: schema dropped (--reset-schema): it was not created by gendurable demo" via=cli user=`)
	require.Contains(t, errOut, "schema="+schema+` held="holds gendurable's tables (`)
	// The demo's own schema, dropped and recreated by the next run: quiet.
	_, errOut, code = cli(t, "demo", "--orders", "1", "--schema", schema)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, errOut, "schema dropped")
}

// TestASecondDemoLeavesTheRunningOneAlone: a demo started while another
// runs in the same schema is refused at once (exit 4, "running in it"),
// and the first runs to its end. The second's drop had locked the tables
// one by one while the first's workers wrote, and the first died of a
// deadlock (a newcomer's probe).
func TestASecondDemoLeavesTheRunningOneAlone(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, NoMigrate: true})
	schema := scratchName(t, pool, "gddemo_")
	out, errb, done := startDemo(t, schema, 300)

	start := time.Now()
	_, errOut, code := cli(t, "demo", "--orders", "5", "--schema", schema)
	require.Equal(t, exitConflict, code, errOut)
	require.Contains(t, errOut, "running in it")
	require.Less(t, time.Since(start), 30*time.Second, "refused at once, not after three lock waits of 5 s each and more")
	select {
	case err := <-done:
		require.NoError(t, err, "the first demo: %s%s", out.String(), errb.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("the first demo did not end: %s%s", out.String(), errb.String())
	}
	require.Contains(t, out.String(), "done in")
}

// TestADemoWhoseTablesAreDroppedUnderItEnds: `migrate down` of the schema
// a demo runs in (the operator's confirmed command, not refused) ends the
// demo with an error in bounded time. Its engines' Stop had no deadline:
// every outcome's write to the vanished tables was retried for a lease,
// batch after batch, and the demo ran on for minutes, deaf to SIGTERM (a
// hostile operator's probe).
func TestADemoWhoseTablesAreDroppedUnderItEnds(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, NoMigrate: true})
	schema := scratchName(t, pool, "gddemo_")
	out, errb, done := startDemo(t, schema, 3000)

	_, errOut, code := cli(t, "migrate", "down", "--yes", "--schema", schema)
	require.Equal(t, 0, code, errOut)
	select {
	case err := <-done:
		require.Error(t, err, "the demo's tables are gone: %s", out.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("the demo did not end: %s%s", out.String(), errb.String())
	}
}

// startDemo starts `gendurable demo` of orders checkouts in schema, in the
// background (killed when the test ends), and waits until it has inserted
// them: its output, and its exit on done.
func startDemo(t *testing.T, schema string, orders int) (out, errb *syncbuf.Buffer, done <-chan error) {
	t.Helper()
	demo := exec.Command(binary, "demo", "--orders", strconv.Itoa(orders), "--schema", schema)
	demo.Env = append(os.Environ(), "DATABASE_URL="+dbtest.URL())
	out, errb = &syncbuf.Buffer{}, &syncbuf.Buffer{}
	demo.Stdout, demo.Stderr = out, errb
	require.NoError(t, demo.Start())
	exited := make(chan error, 1)
	go func() { exited <- demo.Wait() }()
	t.Cleanup(func() { _ = demo.Process.Kill() })
	inserted := fmt.Sprintf("inserted %d checkouts", orders)
	require.Eventually(t, func() bool { return strings.Contains(out.String(), inserted) },
		60*time.Second, 20*time.Millisecond, "the demo started: %s%s", out.String(), errb.String())
	return out, errb, exited
}
