package scratch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// freshName is a schema name no one uses, dropped when the test ends.
func freshName(t *testing.T, pool *pgxpool.Pool) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	name := "gdscratch_" + hex.EncodeToString(b)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+name+`" CASCADE`) })
	return name
}

// TestEnsureKeepsItsOwnSchemaAndRefusesOthers: Ensure creates a missing
// schema marked and migrated, keeps a marked one with what is in it (where
// Prepare would drop it), creates it once when processes race for it, and
// refuses an unmarked one, changing nothing, with the caller's remedy.
func TestEnsureKeepsItsOwnSchemaAndRefusesOthers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	o := Options{Owner: "quickstart", Remedy: "drop it yourself"}

	own := freshName(t, pool)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs { // four processes starting at once: one creates it
		wg.Go(func() {
			h, err := Ensure(ctx, pool, own, o)
			h.Release()
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	var comment string
	require.NoError(t, pool.QueryRow(ctx, `SELECT obj_description($1::regnamespace, 'pg_namespace')`, own).Scan(&comment))
	require.Contains(t, comment, "created by gendurable quickstart")
	v, err := migrate.Installed(ctx, pool, own)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v)

	_, err = pool.Exec(ctx, `INSERT INTO "`+own+`".gendurable_queues (name) VALUES ('kept')`)
	require.NoError(t, err)
	h, err := Ensure(ctx, pool, own, o)
	require.NoError(t, err)
	h.Release()
	var kept int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+own+`".gendurable_queues WHERE name = 'kept'`).Scan(&kept))
	require.Equal(t, 1, kept, "a marked schema keeps what is in it")

	other := freshName(t, pool)
	_, err = pool.Exec(ctx, `CREATE SCHEMA "`+other+`"; CREATE TABLE "`+other+`".mine (x int)`)
	require.NoError(t, err)
	h, err = Ensure(ctx, pool, other, o)
	require.Nil(t, h)
	require.ErrorIs(t, err, ErrNotScratch)
	require.ErrorContains(t, err, `holds an object that gendurable did not create (table `+other+`.mine): gendurable quickstart drops only a schema that is empty or holds gendurable's objects alone; nothing was changed`)
	require.NotContains(t, err.Error(), "--reset-schema")
	var objects int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace`, other).Scan(&objects))
	require.Equal(t, 1, objects, "someone else's schema is left as it was")

	err = Prepare(ctx, pool, other, Options{Owner: "demo"})
	require.ErrorIs(t, err, ErrNotScratch)
	require.ErrorContains(t, err, `holds an object that gendurable did not create (table `+other+`.mine)`)
	require.NotContains(t, err.Error(), "--reset-schema", "no reset drops someone's table")

	installed := freshName(t, pool)
	_, err = migrate.Up(ctx, pool, installed)
	require.NoError(t, err)
	err = Prepare(ctx, pool, installed, Options{Owner: "demo"})
	require.ErrorIs(t, err, ErrNotScratch)
	require.ErrorContains(t, err, "choose another --schema, or pass --reset-schema", "the default remedy")
}

// TestARefusalNamesTheCommandThatMarkedTheSchema: a marked schema that a
// run refuses to drop is said to be created by the command its mark names
// — a newcomer's `gendurable demo --schema quickstart` was told the
// quickstart's schema "was created by gendurable demo or bench".
func TestARefusalNamesTheCommandThatMarkedTheSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	schema := freshName(t, pool)
	require.NoError(t, Prepare(ctx, pool, schema, Options{Owner: "quickstart"}))
	_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('billing', 'a')`)
	require.NoError(t, err)
	err = Prepare(ctx, pool, schema, Options{Owner: "demo"})
	require.ErrorIs(t, err, ErrNotScratch)
	require.ErrorContains(t, err, `"`+schema+`" was created by gendurable quickstart, but holds rows this program did not write: 1 instance of a machine this program does not run ("billing")`)
	require.ErrorContains(t, Drop(ctx, pool, schema), "was created by gendurable quickstart")
}

// TestAMarkedSchemaWithSomeoneElsesRowsIsNotDropped: a schema demo or bench
// created is dropped on their next run only while it holds nothing but
// rows of their own machines. Instances of another machine, another
// machine's definition or an operator's queue row make it someone else's
// data: Prepare refuses it (ErrNotScratch, nothing changed) unless Reset,
// and Drop leaves it alone.
func TestAMarkedSchemaWithSomeoneElsesRowsIsNotDropped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	Share("checkout", "ship_item") // what the demo's package does in its init
	o := Options{Owner: "demo"}
	count := func(schema, table string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".`+table).Scan(&n))
		return n
	}
	for _, tc := range []struct{ name, insert, table string }{
		{"another machine's instances", `INSERT INTO {{s}}.gendurable_instances (fsm, step) VALUES ('billing', 'a'), ('checkout', 'a')`, "gendurable_instances"},
		{"another machine's definition", `INSERT INTO {{s}}.gendurable_machines (name, version, start_step, steps) VALUES ('billing', 1, 'a', '["a"]')`, "gendurable_machines"},
		{"an operator's paused queue", `INSERT INTO {{s}}.gendurable_queues (name, paused) VALUES ('orders', true)`, "gendurable_queues"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schema := freshName(t, pool)
			require.NoError(t, Prepare(ctx, pool, schema, o))
			_, err := pool.Exec(ctx, strings.ReplaceAll(tc.insert, "{{s}}", `"`+schema+`"`))
			require.NoError(t, err)
			before := count(schema, tc.table)

			err = Prepare(ctx, pool, schema, o)
			require.ErrorIs(t, err, ErrNotScratch)
			require.Contains(t, err.Error(), "was created by gendurable demo, but holds rows this program did not write")
			require.Equal(t, before, count(schema, tc.table), "a refused schema keeps its rows")
			require.ErrorIs(t, Drop(ctx, pool, schema), ErrNotScratch)
			require.Equal(t, before, count(schema, tc.table))

			reset := o
			reset.Reset = true
			require.NoError(t, Prepare(ctx, pool, schema, reset), "the operator's explicit reset drops it")
			require.Zero(t, count(schema, tc.table))
		})
	}

	// A schema someone else's workers are writing is refused without
	// waiting for their transactions (and so without holding them up
	// behind a lock request of its own).
	busy := freshName(t, pool)
	require.NoError(t, Prepare(ctx, pool, busy, o))
	_, err := pool.Exec(ctx, `INSERT INTO "`+busy+`".gendurable_instances (fsm, step) VALUES ('billing', 'a')`)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE "`+busy+`".gendurable_instances SET priority = 1`)
	require.NoError(t, err)
	start := time.Now()
	require.ErrorIs(t, Prepare(ctx, pool, busy, o), ErrNotScratch)
	require.Less(t, time.Since(start), 3*time.Second, "refused without waiting on the writer's lock")
	require.NoError(t, tx.Rollback(ctx))

	// A queue paused and resumed since leaves a row that holds nothing: the
	// schema is the command's own (a newcomer paused the demo's queue from
	// the dashboard, resumed it, and the demo refused to run again).
	resumed := freshName(t, pool)
	require.NoError(t, Prepare(ctx, pool, resumed, o))
	_, err = pool.Exec(ctx, `INSERT INTO "`+resumed+`".gendurable_queues (name, paused) VALUES ('default', false)`)
	require.NoError(t, err)
	require.NoError(t, Prepare(ctx, pool, resumed, o))
	require.Zero(t, count(resumed, "gendurable_queues"))

	// Its own machines' rows, in every status, are the command's to drop,
	// and so are those of a machine another scratch command of the program
	// shares (bench reuses the demo's schema).
	Share("bench_job") // what bench's package does in its init
	schema := freshName(t, pool)
	require.NoError(t, Prepare(ctx, pool, schema, o))
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('checkout', 'a'), ('ship_item', 'b'), ('bench_job', 'perform')`)
	require.NoError(t, err)
	require.NoError(t, Prepare(ctx, pool, schema, o))
	require.Zero(t, count(schema, "gendurable_instances"), "a rerun starts from an empty schema")
}

// TestAMarkedSchemaWhoseTablesSomeoneAddedToIsNotDropped: DROP … RESTRICT
// takes a table's column, index, trigger, policy, rule, check constraint,
// extended statistics (even in another schema) and publication membership
// with it without a word, so a marked schema whose tables hold any of them
// is refused (nothing changed) and kept by Drop. Before, a hostile-operator
// probe's column and its data, trigger, index, policy, statistics and
// publication membership went with the demo's next run, exit 0. The same
// schema without the addition is dropped, at an older version too.
func TestAMarkedSchemaWhoseTablesSomeoneAddedToIsNotDropped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	Share("checkout") // the machine of the row below: the demo's own
	o := Options{Owner: "demo"}
	exists := func(schema string) bool {
		var ok bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&ok))
		return ok
	}
	for _, tc := range []struct{ name, add, undo, says string }{
		{"a column", `ALTER TABLE {{s}}.gendurable_instances ADD COLUMN my_note text; UPDATE {{s}}.gendurable_instances SET my_note = 'mine'`,
			`ALTER TABLE {{s}}.gendurable_instances DROP COLUMN my_note`, "column gendurable_instances.my_note text"},
		{"an index", `CREATE INDEX my_idx ON {{s}}.gendurable_instances (queue)`, `DROP INDEX {{s}}.my_idx`, "relation my_idx (i)"},
		{"a trigger", `CREATE FUNCTION {{s}}_trg() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
			CREATE TRIGGER my_trg AFTER INSERT ON {{s}}.gendurable_instances FOR EACH STATEMENT EXECUTE FUNCTION {{s}}_trg()`,
			`DROP TRIGGER my_trg ON {{s}}.gendurable_instances; DROP FUNCTION {{s}}_trg()`, "trigger gendurable_instances.my_trg"},
		{"a policy and row-level security", `ALTER TABLE {{s}}.gendurable_instances ENABLE ROW LEVEL SECURITY;
			CREATE POLICY my_pol ON {{s}}.gendurable_instances USING (true)`,
			`DROP POLICY my_pol ON {{s}}.gendurable_instances; ALTER TABLE {{s}}.gendurable_instances DISABLE ROW LEVEL SECURITY`, "policy gendurable_instances.my_pol"},
		{"a check constraint", `ALTER TABLE {{s}}.gendurable_queues ADD CONSTRAINT my_check CHECK (name <> 'x')`,
			`ALTER TABLE {{s}}.gendurable_queues DROP CONSTRAINT my_check`, "constraint gendurable_queues.my_check CHECK"},
		// A review's further cases: what a drop also takes without a word.
		{"a column's comment", `COMMENT ON COLUMN {{s}}.gendurable_instances.state IS 'mine'`,
			`COMMENT ON COLUMN {{s}}.gendurable_instances.state IS NULL`, "comment mine"},
		{"a grant", `GRANT SELECT ON {{s}}.gendurable_instances TO PUBLIC`,
			`REVOKE SELECT ON {{s}}.gendurable_instances FROM PUBLIC`, "granted"},
		{"a column's default", `ALTER TABLE {{s}}.gendurable_queues ALTER COLUMN paused SET DEFAULT true`,
			`ALTER TABLE {{s}}.gendurable_queues ALTER COLUMN paused SET DEFAULT false`, "column gendurable_queues.paused boolean not null default true"},
		{"a storage option", `ALTER TABLE {{s}}.gendurable_signals SET (fillfactor = 70)`,
			`ALTER TABLE {{s}}.gendurable_signals RESET (fillfactor)`, "fillfactor=70"},
		{"an enum label", `ALTER TYPE {{s}}.gendurable_status ADD VALUE 'archived'`, "", "archived"},
		{"a publication of the schema", `CREATE PUBLICATION {{s}}_spub FOR TABLES IN SCHEMA {{s}}`,
			`DROP PUBLICATION {{s}}_spub`, "of the schema"},
		{"default privileges", `ALTER DEFAULT PRIVILEGES IN SCHEMA {{s}} GRANT SELECT ON TABLES TO PUBLIC`,
			`ALTER DEFAULT PRIVILEGES IN SCHEMA {{s}} REVOKE SELECT ON TABLES FROM PUBLIC`, "default privileges"},
		{"a publication's membership", `CREATE PUBLICATION {{s}}_pub FOR TABLE {{s}}.gendurable_instances`,
			`DROP PUBLICATION {{s}}_pub`, "publication gdscratch_"},
		{"statistics in another schema", `CREATE STATISTICS public.{{s}}_st ON status, queue FROM {{s}}.gendurable_instances`,
			`DROP STATISTICS public.{{s}}_st`, "_st on gendurable_instances"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schema := freshName(t, pool)
			sub := func(sql string) string { return strings.ReplaceAll(sql, "{{s}}", schema) }
			require.NoError(t, Prepare(ctx, pool, schema, o))
			_, err := pool.Exec(ctx, sub(`INSERT INTO {{s}}.gendurable_instances (fsm, step) VALUES ('checkout', 'a')`))
			require.NoError(t, err)
			if tc.undo != "" {
				t.Cleanup(func() { _, _ = pool.Exec(context.Background(), sub(tc.undo)) })
			}
			_, err = pool.Exec(ctx, sub(tc.add))
			require.NoError(t, err)

			err = Prepare(ctx, pool, schema, o)
			require.ErrorIs(t, err, ErrNotScratch)
			require.ErrorContains(t, err, "holds what a schema migrated to the same version does not")
			require.ErrorContains(t, err, tc.says)
			require.ErrorIs(t, Drop(ctx, pool, schema), ErrNotScratch)
			require.True(t, exists(schema), "kept")
			var n int
			require.NoError(t, pool.QueryRow(ctx, sub(`SELECT count(*) FROM {{s}}.gendurable_instances`)).Scan(&n))
			require.Equal(t, 1, n, "its rows kept")

			if tc.undo == "" {
				return // no way back (an enum's label)
			}
			_, err = pool.Exec(ctx, sub(tc.undo))
			require.NoError(t, err)
			require.NoError(t, Drop(ctx, pool, schema), "without the addition it is the command's own again")
			require.False(t, exists(schema))
		})
	}

	// An addition committed while the drop waits for its locks is seen (a
	// review: a column added to gendurable_signals in a transaction open
	// when the demo started went with the drop).
	racing := freshName(t, pool)
	require.NoError(t, Prepare(ctx, pool, racing, o))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `ALTER TABLE "`+racing+`".gendurable_signals ADD COLUMN my_audit text`)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- Prepare(ctx, pool, racing, o) }()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	err = <-done
	require.ErrorIs(t, err, ErrNotScratch)
	require.ErrorContains(t, err, "column gendurable_signals.my_audit text")
	require.True(t, exists(racing))

	// A schema of a newer gendurable is refused as such (its version named),
	// not compared with a version this one does not have.
	newer := freshName(t, pool)
	require.NoError(t, Prepare(ctx, pool, newer, o))
	_, err = pool.Exec(ctx, `COMMENT ON TABLE "`+newer+`".gendurable_instances IS 'gendurable schema version 999'`)
	require.NoError(t, err)
	err = Prepare(ctx, pool, newer, o)
	require.ErrorIs(t, err, migrate.ErrSchemaVersion)
	require.NotContains(t, err.Error(), "gendurable_shape_")
	require.True(t, exists(newer))

	// A marked schema at an older version is compared with that version.
	old := freshName(t, pool)
	require.NoError(t, Prepare(ctx, pool, old, o))
	_, err = migrate.To(ctx, pool, old, 9)
	require.NoError(t, err)
	require.NoError(t, Drop(ctx, pool, old))
	require.False(t, exists(old))
}

// TestAMarkedSchemaThatSomethingElsewhereHangsOnIsNotDropped: an object
// outside the schema that depends on one of its tables automatically — a
// constraint trigger on a table of the user's declared FROM
// gendurable_instances — is dropped with the table by DROP TABLE … RESTRICT without a word (a
// hostile-operator probe: the demo's next run took the trigger, exit 0). The
// schema is refused and kept, and so is the object; without it the schema
// is the command's own again.
func TestAMarkedSchemaThatSomethingElsewhereHangsOnIsNotDropped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	Share("checkout")
	o := Options{Owner: "demo"}
	for _, tc := range []struct{ name, add, check, undo, says string }{
		{"a constraint trigger", `CREATE TABLE public.{{s}}_ledger (id int);
			CREATE FUNCTION public.{{s}}_chk() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
			CREATE CONSTRAINT TRIGGER guard AFTER INSERT ON public.{{s}}_ledger FROM {{s}}.gendurable_instances
			  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.{{s}}_chk()`,
			`SELECT count(*) FROM pg_trigger WHERE tgname = 'guard' AND tgrelid = 'public.{{s}}_ledger'::regclass`,
			`DROP TABLE public.{{s}}_ledger; DROP FUNCTION public.{{s}}_chk()`, "trigger guard on public.{{s}}_ledger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schema := freshName(t, pool)
			sub := func(sql string) string { return strings.ReplaceAll(sql, "{{s}}", schema) }
			require.NoError(t, Prepare(ctx, pool, schema, o))
			t.Cleanup(func() { _, _ = pool.Exec(context.Background(), sub(tc.undo)) })
			_, err := pool.Exec(ctx, sub(tc.add))
			require.NoError(t, err)

			err = Prepare(ctx, pool, schema, o)
			require.ErrorIs(t, err, ErrNotScratch)
			require.ErrorContains(t, err, "objects elsewhere depend on it")
			require.ErrorContains(t, err, sub(tc.says))
			require.ErrorIs(t, Drop(ctx, pool, schema), ErrNotScratch)
			var n int
			require.NoError(t, pool.QueryRow(ctx, sub(tc.check)).Scan(&n))
			require.Equal(t, 1, n, "the object elsewhere is kept")
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n))
			require.Equal(t, 1, n, "the schema is kept")

			_, err = pool.Exec(ctx, sub(tc.undo))
			require.NoError(t, err)
			require.NoError(t, Drop(ctx, pool, schema), "without it the schema is the command's own again")
		})
	}
}

// TestADropThatCannotHaveItsLocksGivesUp: a drop whose lock waits run out
// (another transaction reads the schema's tables: another demo running in
// it) fails with ErrBusy in seconds (three tries, each in a transaction of its own), its locks freed and nothing dropped.
// Before, the migration inside the drop's transaction tried its version
// again and again — rolling back to a savepoint, which kept the locks the
// transaction had taken — until its context ended: two demos started
// together waited for each other for as long as a newcomer let them.
func TestADropThatCannotHaveItsLocksGivesUp(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	Share("checkout")
	o := Options{Owner: "demo"}
	schema := freshName(t, pool)
	ctx := t.Context()
	require.NoError(t, Prepare(ctx, pool, schema, o))
	reader, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = reader.Rollback(context.Background()) }()
	_, err = reader.Exec(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_signals`)
	require.NoError(t, err)

	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	err = Prepare(dctx, pool, schema, o)
	require.ErrorIs(t, err, ErrBusy)
	// Three 5 s lock waits and two 1 s pauses, about 17 s; a loaded
	// machine (a full test run beside others) took 32 s once. Half the
	// context's time: it gave up, its context did not end it.
	require.Less(t, time.Since(start), 60*time.Second, "gave up after its third lock wait that ran out")
	_, err = reader.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('checkout', 'a')`)
	require.NoError(t, err, "the drop's locks were freed")
	require.NoError(t, reader.Commit(ctx))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances`).Scan(&n))
	require.Equal(t, 1, n, "nothing was dropped")
	require.NoError(t, Prepare(ctx, pool, schema, o), "with the reader gone the drop goes through")
}

// TestASchemaInUseIsNotDroppedUnderItsRun: a schema a run holds (Use: the
// demo while it runs, a quickstart worker) is refused by another run's
// Prepare at once, before any lock on its tables — the holder's
// transactions, under way meanwhile, are neither held up nor chosen as a
// deadlock's victim. Before, the second demo's drop locked the tables one
// by one while the first demo's workers wrote, and the first died of a
// deadlock (a newcomer's probe). Once released, the drop goes
// through.
func TestASchemaInUseIsNotDroppedUnderItsRun(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	Share("checkout")
	o := Options{Owner: "demo"}
	schema := freshName(t, pool)
	ctx := t.Context()
	require.NoError(t, Prepare(ctx, pool, schema, o))
	hold, err := Use(ctx, pool, schema)
	require.NoError(t, err)
	defer hold.Release()

	// The run's transaction holds a row lock of instances and a write lock
	// of signals, as a demo's signal send does, while the second run
	// starts.
	run, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = run.Rollback(context.Background()) }()
	_, err = run.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('checkout', 'a')`)
	require.NoError(t, err)

	start := time.Now()
	err = Prepare(ctx, pool, schema, o)
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorContains(t, err, "running in it")
	require.Less(t, time.Since(start), 10*time.Second, "refused at once, not after three lock waits of 5 s")
	var locks int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
		WHERE c.relnamespace = $1::regnamespace AND l.mode IN ('ShareRowExclusiveLock', 'AccessExclusiveLock')`, schema).Scan(&locks))
	require.Zero(t, locks, "no table lock left behind")
	// The run goes on: its next statement takes a lock of another table.
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = run.Exec(lctx, `INSERT INTO "`+schema+`".gendurable_signals (target_id, name, payload)
		SELECT id, 'go', 'null' FROM "`+schema+`".gendurable_instances`)
	require.NoError(t, err)
	require.NoError(t, run.Commit(ctx))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances`).Scan(&n))
	require.Equal(t, 1, n, "nothing was dropped")

	// A run starting while another's drop is under way is refused too.
	hold.Release()
	drop, err := pool.Begin(ctx)
	require.NoError(t, err)
	var free bool
	require.NoError(t, drop.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtext('gendurable/scratch'), hashtext($1))`, schema).Scan(&free))
	require.True(t, free)
	_, err = Use(ctx, pool, schema)
	require.ErrorIs(t, err, ErrBusy)
	require.NoError(t, drop.Rollback(ctx))

	require.NoError(t, Prepare(ctx, pool, schema, o), "released, the drop goes through")

	// A run's own hold, taken before its drop, does not stop the drop (it
	// runs on the hold's connection), and it stops another run's.
	mine, err := Use(ctx, pool, schema)
	require.NoError(t, err)
	defer mine.Release()
	withHold := o
	withHold.Hold = mine
	require.NoError(t, Prepare(ctx, pool, schema, withHold))
	require.ErrorIs(t, Prepare(ctx, pool, schema, o), ErrBusy)
}

// TestAMarkedSchemaNamedLikeAWordInsideItIsItsOwn: a demo schema whose
// name also occurs inside gendurable's own definitions ("cursor" is in the
// pick's "p_cursor", "rs" in "errors") is dropped by the next run like any
// other. The shape comparison replaced every occurrence of the name, in
// words too, and found the schema's own functions changed: the second
// demo refused its own schema (a hostile operator's probe).
func TestAMarkedSchemaNamedLikeAWordInsideItIsItsOwn(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	ctx := t.Context()
	for _, schema := range []string{"cursor", "rs"} {
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`) })
		require.NoError(t, Prepare(ctx, pool, schema, Options{Owner: "demo"}), schema)
		require.NoError(t, Prepare(ctx, pool, schema, Options{Owner: "demo"}), "%s: the second run drops its own schema", schema)
	}
}

// TestAResetDoesNotDropASchemaInUse: the operator's --reset-schema (Reset,
// confirmed) of a schema a run holds (a quickstart worker started in it
// while the prompt waited) is refused, nothing dropped. The hold was
// checked only on the way to the prompt, not by the drop after it (a
// hostile operator's probe).
func TestAResetDoesNotDropASchemaInUse(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	ctx := t.Context()
	schema := freshName(t, pool)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	var hold *Hold
	confirm := func(string) (bool, error) {
		var err error
		hold, err = Use(ctx, pool, schema) // a worker starts while the prompt waits
		return err == nil, err
	}
	err = Prepare(ctx, pool, schema, Options{Owner: "demo", Reset: true, Confirm: confirm})
	defer hold.Release()
	require.ErrorIs(t, err, ErrBusy)
	var kept bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, `"`+schema+`".gendurable_instances`).Scan(&kept))
	require.True(t, kept, "nothing dropped")
	hold.Release()
	require.NoError(t, Prepare(ctx, pool, schema, Options{Owner: "demo", Reset: true, Confirm: func(string) (bool, error) { return true, nil }}))
}

// TestAResetDoesNotDropASchemaWhereStepsRun: a library worker holds no Use
// of its schema, so --reset-schema --yes dropped a schema whose steps were
// running (an operator probe: the worker's leases lost, its tables gone).
// Its live leases now refuse the drop; once they have run out (the worker
// gone), the reset drops it.
func TestAResetDoesNotDropASchemaWhereStepsRun(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	ctx := t.Context()
	schema := freshName(t, pool)
	_, err := pool.Exec(ctx, `CREATE SCHEMA "`+schema+`"`)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step, status, lease_expires_at, claim_token)
		VALUES ('billing', 'a', 'executing', now() + interval '1 minute', 1), ('billing', 'a', 'executing', now() + interval '1 minute', 2)`)
	require.NoError(t, err)
	yes := func(string) (bool, error) { return true, nil }
	err = Prepare(ctx, pool, schema, Options{Owner: "demo", Reset: true, Confirm: yes})
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorContains(t, err, "2 instances are running in it under live leases")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances`).Scan(&n))
	require.Equal(t, 2, n, "nothing dropped")
	_, err = pool.Exec(ctx, `UPDATE "`+schema+`".gendurable_instances SET lease_expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	require.NoError(t, Prepare(ctx, pool, schema, Options{Owner: "demo", Reset: true, Confirm: yes}))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances`).Scan(&n))
	require.Equal(t, 0, n, "dropped and made afresh")
}

// TestAResetNeverDropsSomeonesObjects: the operator's reset (Reset, its
// prompt answered yes) drops a schema that holds gendurable's objects
// alone, instances and all, and nothing else: a table of someone's in it,
// one created while the prompt waited, a view elsewhere of its instances,
// and the public schema are refused (ErrNotScratch, naming the table, no
// reset suggested), and everything stays. Before, the reset's DROP SCHEMA
// … CASCADE took them all — `demo --schema public --reset-schema --yes`
// dropped a user's tables and recreated public without its privileges (an
// operator probe).
func TestAResetNeverDropsSomeonesObjects(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	ctx := t.Context()
	yes := func(string) (bool, error) { return true, nil }
	reset := Options{Owner: "demo", Reset: true, Confirm: yes}
	installed := func() string {
		schema := freshName(t, pool)
		_, err := migrate.Up(ctx, pool, schema)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('billing', 'a')`)
		require.NoError(t, err)
		return schema
	}
	count := func(table string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		return n
	}

	t.Run("a table of someone's", func(t *testing.T) {
		schema := installed()
		_, err := pool.Exec(ctx, `CREATE TABLE "`+schema+`".ledger (x int); INSERT INTO "`+schema+`".ledger VALUES (1)`)
		require.NoError(t, err)
		err = Prepare(ctx, pool, schema, reset)
		require.ErrorIs(t, err, ErrNotScratch)
		require.ErrorContains(t, err, `holds an object that gendurable did not create (table `+schema+`.ledger)`)
		require.NotContains(t, err.Error(), "--reset-schema")
		require.Equal(t, 1, count(`"`+schema+`".ledger`))
		require.Equal(t, 1, count(`"`+schema+`".gendurable_instances`))
	})
	t.Run("a table created while the prompt waited", func(t *testing.T) {
		schema := installed()
		err := Prepare(ctx, pool, schema, Options{Owner: "demo", Reset: true, Confirm: func(string) (bool, error) {
			_, err := pool.Exec(ctx, `CREATE TABLE "`+schema+`".late (x int); INSERT INTO "`+schema+`".late VALUES (1)`)
			return err == nil, err
		}})
		require.ErrorIs(t, err, ErrNotScratch)
		require.ErrorContains(t, err, `(table `+schema+`.late)`)
		require.Equal(t, 1, count(`"`+schema+`".late`))
		require.Equal(t, 1, count(`"`+schema+`".gendurable_instances`))
	})
	t.Run("a view elsewhere of its instances", func(t *testing.T) {
		schema, views := installed(), freshName(t, pool)
		_, err := pool.Exec(ctx, `CREATE SCHEMA "`+views+`"; CREATE VIEW "`+views+`".billing AS
			SELECT id FROM "`+schema+`".gendurable_instances`)
		require.NoError(t, err)
		err = Prepare(ctx, pool, schema, reset)
		require.ErrorIs(t, err, ErrNotScratch)
		require.Equal(t, 1, count(`"`+views+`".billing`))
	})
	// What someone added to gendurable's own objects, or to the schema's
	// place elsewhere, is refused before the prompt: the drop took it
	// along without a word (a probe: a trigger, a policy, a foreign key,
	// an owned sequence, the schema's publication).
	noPrompt := Options{Owner: "demo", Reset: true, Confirm: func(q string) (bool, error) {
		t.Errorf("asked %q of a schema the reset refuses", q)
		return false, nil
	}}
	for _, c := range []struct{ name, add, says string }{
		{"a trigger on its instances", `CREATE FUNCTION {{s}}.gendurable_trg() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
			CREATE TRIGGER my_trg AFTER INSERT ON {{s}}.gendurable_instances FOR EACH STATEMENT EXECUTE FUNCTION {{s}}.gendurable_trg()`,
			"trigger gendurable_instances.my_trg"},
		{"a policy", `CREATE POLICY my_pol ON {{s}}.gendurable_instances USING (true)`, "policy gendurable_instances.my_pol"},
		{"a sequence named like gendurable's", `CREATE SEQUENCE {{s}}.gendurable_invoice_no OWNED BY {{s}}.gendurable_instances.id`, "gendurable_invoice_no"},
		{"a table named like gendurable's", `CREATE TABLE {{s}}.gendurable_audit (x int)`, "gendurable_audit"},
		{"the schema's publication", `CREATE PUBLICATION {{s}}_spub FOR TABLES IN SCHEMA {{s}}`, "of the schema"},
	} {
		t.Run(c.name, func(t *testing.T) {
			schema := installed()
			sub := func(sql string) string { return strings.ReplaceAll(sql, "{{s}}", schema) }
			if strings.Contains(c.add, "PUBLICATION") {
				t.Cleanup(func() { _, _ = pool.Exec(context.Background(), sub(`DROP PUBLICATION IF EXISTS {{s}}_spub`)) })
			}
			_, err := pool.Exec(ctx, sub(c.add))
			require.NoError(t, err)
			err = Prepare(ctx, pool, schema, noPrompt)
			require.ErrorIs(t, err, ErrNotScratch)
			require.ErrorContains(t, err, c.says)
			require.NotContains(t, err.Error(), "--reset-schema")
			require.Equal(t, 1, count(`"`+schema+`".gendurable_instances`), "nothing dropped")
		})
	}
	t.Run("a marked schema with a table of someone's in use", func(t *testing.T) {
		// Refused at once, the table named: not after waiting for the
		// table's lock three times, blamed on another run (a probe).
		schema := freshName(t, pool)
		require.NoError(t, Prepare(ctx, pool, schema, Options{Owner: "demo"}))
		_, err := pool.Exec(ctx, `CREATE TABLE "`+schema+`".orders (id int)`)
		require.NoError(t, err)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `INSERT INTO "`+schema+`".orders VALUES (1)`)
		require.NoError(t, err)
		err = Prepare(ctx, pool, schema, Options{Owner: "demo"})
		require.ErrorIs(t, err, ErrNotScratch)
		require.NotErrorIs(t, err, ErrBusy)
		require.ErrorContains(t, err, `(table `+schema+`.orders)`)
	})
	t.Run("gendurable's objects alone", func(t *testing.T) {
		schema := installed()
		require.NoError(t, Prepare(ctx, pool, schema, reset))
		require.Equal(t, 0, count(`"`+schema+`".gendurable_instances`), "dropped and made afresh")
	})
	t.Run("an install upgraded from version 1", func(t *testing.T) {
		// Compared with a fresh install of the latest version, an upgraded
		// one is gendurable's alone too: no false refusal.
		schema := freshName(t, pool)
		_, err := migrate.To(ctx, pool, schema, 1)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('billing', 'a')`)
		require.NoError(t, err)
		_, err = migrate.Up(ctx, pool, schema)
		require.NoError(t, err)
		require.NoError(t, Prepare(ctx, pool, schema, reset))
		require.Equal(t, 0, count(`"`+schema+`".gendurable_instances`), "dropped and made afresh")
	})
	t.Run("public", func(t *testing.T) {
		// In a database of its own: were the refusal to fail, the shared
		// test database keeps its public schema.
		db := freshName(t, pool)
		_, err := pool.Exec(ctx, `CREATE DATABASE "`+db+`"`)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP DATABASE IF EXISTS "`+db+`" WITH (FORCE)`) })
		cfg, err := pgxpool.ParseConfig(dbtest.URL())
		require.NoError(t, err)
		cfg.ConnConfig.Database, cfg.MaxConns = db, 2
		other, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer other.Close()
		_, err = migrate.Up(ctx, other, "public")
		require.NoError(t, err)
		err = Prepare(ctx, other, "public", reset)
		require.ErrorIs(t, err, ErrNotScratch)
		require.ErrorContains(t, err, "default schema")
		require.NotContains(t, err.Error(), "--reset-schema")
		var kept bool
		require.NoError(t, other.QueryRow(ctx, `SELECT to_regclass('public.gendurable_instances') IS NOT NULL`).Scan(&kept))
		require.True(t, kept, "public left as it was")
	})
}
