package migrate_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()

	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Zero(t, v)

	res, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Result{From: 0, To: migrate.Latest(), Applied: allVersions()}, res)
	v, err = migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v)

	res, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, res.Applied, "up is idempotent")

	res, err = migrate.Down(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, reversed(allVersions()), res.Applied)
	var tables int
	require.NoError(t, pool.QueryRow(ctx,
		`SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1`, schema).Scan(&tables))
	require.Zero(t, tables, "down leaves nothing behind")

	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
}

// TestUpDownOfASchemaWithCapitals: a schema whose name needs quoting
// ("Billing_…") goes up and all the way down like any other. Down refused
// it, listing gendurable's own indexes as objects "outside the schema"
// (pg_identify_object quotes the schema's name; a library-misuse probe).
func TestUpDownOfASchemaWithCapitals(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	mixed := "Billing_" + schema
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+mixed+`" CASCADE`) })
	_, err := migrate.Up(ctx, pool, mixed)
	require.NoError(t, err)
	res, err := migrate.Down(ctx, pool, mixed)
	require.NoError(t, err)
	require.Equal(t, reversed(allVersions()), res.Applied)
	var left int
	require.NoError(t, pool.QueryRow(ctx,
		`SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1`, mixed).Scan(&left))
	require.Zero(t, left, "down leaves nothing behind")
}

// TestDownOfAMissingSchemaCreatesNothing: `migrate down` (Down, or To(0))
// of a schema that does not exist has nothing to remove, and must not leave
// an empty schema behind that it created itself.
func TestDownOfAMissingSchemaCreatesNothing(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	absent := schema + "_absent"
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+absent+`"`) })
	res, err := migrate.Down(ctx, pool, absent)
	require.NoError(t, err)
	require.Equal(t, migrate.Result{}, res)
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, absent).Scan(&exists))
	require.False(t, exists, "migrate down created the schema it was to empty")
}

func TestConcurrentUpAppliesOnce(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 8})
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]migrate.Result, 6)
	errs := make([]error, 6)
	for i := range results {
		wg.Add(1)
		go func() { defer wg.Done(); results[i], errs[i] = migrate.Up(ctx, pool, schema) }()
	}
	wg.Wait()
	applied := 0
	for i := range results {
		require.NoError(t, errs[i])
		applied += len(results[i].Applied)
	}
	require.Equal(t, len(allVersions()), applied, "each migration was applied exactly once")
	for i := range results {
		// Each version is its own transaction, so the migrators take turns:
		// each says the version it left the schema at, not the last it
		// applied (one reported 18 of 19).
		require.Equal(t, migrate.Latest(), results[i].To, "migrator %d: %+v", i, results[i])
	}
}

// TestAnUpAndADownAtOnceDoNotUndoEachOther: with a transaction per
// version, an Up and a DownTo running at once took turns on the migration
// lock, each undoing the other's last version (420–1136 versions applied
// each within 20 s, columns dropped and added again) until their contexts
// ended — with context.Background(), forever. A migrator that finds the
// schema moved back the other way since its last version now stops there
// (ErrDirection); the other finishes.
func TestAnUpAndADownAtOnceDoNotUndoEachOther(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 6})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for round := range 3 {
		_, err := migrate.To(ctx, pool, schema, 10)
		require.NoError(t, err)
		var wg sync.WaitGroup
		var up, down migrate.Result
		var upErr, downErr error
		wg.Add(2)
		go func() { defer wg.Done(); up, upErr = migrate.Up(ctx, pool, schema) }()
		go func() { defer wg.Done(); down, downErr = migrate.DownTo(ctx, pool, schema, 2) }()
		wg.Wait()
		require.NoError(t, ctx.Err(), "round %d: they undid each other until the deadline", round)
		v, err := migrate.Installed(ctx, pool, schema)
		require.NoError(t, err)
		require.LessOrEqual(t, len(up.Applied)+len(down.Applied), 2*migrate.Latest(), "round %d: up %v, down %v", round, up.Applied, down.Applied)
		switch {
		case upErr == nil && downErr == nil: // one ran wholly before the other
			require.Contains(t, []int{2, migrate.Latest()}, v)
		case upErr != nil:
			require.ErrorIs(t, upErr, migrate.ErrDirection)
			require.Equal(t, movedTo(t, upErr), up.To, "round %d: the stopped up's Result.To is where it found the schema", round)
			require.NoError(t, downErr)
			require.Equal(t, 2, v)
			require.Equal(t, 2, down.To)
		default:
			require.ErrorIs(t, downErr, migrate.ErrDirection)
			require.Equal(t, movedTo(t, downErr), down.To, "round %d: the stopped down's Result.To is where it found the schema", round)
			require.Equal(t, migrate.Latest(), v)
			require.Equal(t, v, up.To)
		}
	}
}

// movedTo is the version an ErrDirection error says another migrator moved
// the schema to.
func movedTo(t *testing.T, err error) int {
	t.Helper()
	m := regexp.MustCompile(`was moved to version (\d+)`).FindStringSubmatch(err.Error())
	require.NotNil(t, m, "%v", err)
	v, convErr := strconv.Atoi(m[1])
	require.NoError(t, convErr)
	return v
}

func TestInvalidSchemaIsRejected(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	for _, bad := range []string{"", "1abc", `a"b`, "a b", "a;drop", strings.Repeat("x", 64), "ünï"} {
		_, err := migrate.Up(context.Background(), pool, bad)
		require.ErrorIs(t, err, migrate.ErrInvalidSchema, bad)
		require.Equal(t, fmt.Sprintf("gendurable: invalid schema name: %q (want 1-63 characters of [A-Za-z0-9_], not starting with a digit)", bad), err.Error())
		_, err = migrate.Installed(context.Background(), pool, bad)
		require.ErrorIs(t, err, migrate.ErrInvalidSchema, bad)
		require.NotContains(t, err.Error(), "read the schema version", "nothing was read (a probe)")
		_, err = migrate.SQL(bad, 0, 1)
		require.ErrorIs(t, err, migrate.ErrInvalidSchema, bad)
	}
}

func TestPrintedSQLInstallsTheSchema(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	up, err := migrate.SQL(schema, 0, migrate.Latest())
	require.NoError(t, err)
	require.Contains(t, up, "CREATE TABLE \""+schema+"\".gendurable_instances")
	_, err = pool.Exec(ctx, up) // what a user's own migration tool would run
	require.NoError(t, err)
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v, "the printed SQL records the version too")

	down, err := migrate.SQL(schema, migrate.Latest(), 0)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, down)
	require.NoError(t, err)
	v, err = migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Zero(t, v)
}

// allVersions lists the embedded migrations' versions in order. A number may
// be missing: one reserved by work merged later.
func allVersions() []int {
	var vs []int
	for _, m := range sqlq.Migrations() {
		vs = append(vs, m.Version)
	}
	return vs
}

func reversed(vs []int) []int {
	out := make([]int, len(vs))
	for i, v := range vs {
		out[len(vs)-1-i] = v
	}
	return out
}

// TestStepwiseUpgrade installs version 1, puts data in it, and upgrades: an
// existing installation keeps its rows.
func TestStepwiseUpgrade(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	res, err := migrate.To(ctx, pool, schema, 1)
	require.NoError(t, err)
	require.Equal(t, []int{1}, res.Applied)
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".gendurable_instances (fsm, step) VALUES ('m', 'a')`)
	require.NoError(t, err)
	res, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, allVersions()[1:], res.Applied)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances WHERE inbox = '{}'`).Scan(&n))
	require.Equal(t, 1, n, "the row survived and got the new columns' defaults")
	res, err = migrate.To(ctx, pool, schema, 1)
	require.NoError(t, err)
	require.Equal(t, reversed(allVersions()[1:]), res.Applied)
}

// TestUpgradeFrom4IndexesChildrenByFanout: version 5 replaces the index on
// parent_id with one on (parent_id, parent_fanout). An installation at
// version 4 with a parent and children of two fan-outs keeps them; after the
// upgrade, the children of the latest fan-out are one index lookup of both
// columns and the children of every fan-out still an index lookup; down to 4
// puts the old index back.
func TestUpgradeFrom4IndexesChildrenByFanout(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	s := `"` + schema + `"`
	res, err := migrate.To(ctx, pool, schema, 4)
	require.NoError(t, err)
	require.Equal(t, allVersions()[:4], res.Applied)
	var parent int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, fanout, children_total)
		VALUES ('m', 'join', 2, 2) RETURNING id`).Scan(&parent))
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, parent_id, parent_fanout)
		SELECT 'c', 'a', $1, CASE WHEN g <= 3 THEN 1 ELSE 2 END FROM generate_series(1, 5) g`, parent)
	require.NoError(t, err)

	parentIndexes := func() map[string]string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT indexname, indexdef FROM pg_indexes
			WHERE schemaname = $1 AND indexname LIKE 'gendurable_instances_parent%'`, schema)
		require.NoError(t, err)
		out := map[string]string{}
		for rows.Next() {
			var name, def string
			require.NoError(t, rows.Scan(&name, &def))
			out[name] = def[strings.Index(def, " USING "):]
		}
		require.NoError(t, rows.Err())
		return out
	}
	// children counts the children of parent (of fan-out gen, if not 0)
	// with every scan but an index scan ruled out, and returns the plan.
	children := func(gen int) (n int, plan string) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off`)
		require.NoError(t, err)
		q := fmt.Sprintf(`SELECT count(*) FROM %s.gendurable_instances WHERE parent_id = %d`, s, parent)
		if gen != 0 {
			q += fmt.Sprintf(` AND parent_fanout = %d`, gen)
		}
		require.NoError(t, tx.QueryRow(ctx, q).Scan(&n))
		rows, err := tx.Query(ctx, `EXPLAIN `+q)
		require.NoError(t, err)
		var lines []string
		for rows.Next() {
			var l string
			require.NoError(t, rows.Scan(&l))
			lines = append(lines, l)
		}
		require.NoError(t, rows.Err())
		return n, strings.Join(lines, "\n")
	}
	require.Equal(t, map[string]string{
		"gendurable_instances_parent": " USING btree (parent_id) WHERE (parent_id IS NOT NULL)",
	}, parentIndexes())

	res, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, 4, res.From)
	require.Equal(t, allVersions()[4:], res.Applied)
	require.Equal(t, map[string]string{
		"gendurable_instances_parent_fanout": " USING btree (parent_id, parent_fanout) WHERE (parent_id IS NOT NULL)",
	}, parentIndexes())
	n, plan := children(2)
	require.Equal(t, 2, n, "the children of the latest fan-out survived the upgrade")
	require.Contains(t, plan, "using gendurable_instances_parent_fanout")
	require.Contains(t, plan, fmt.Sprintf("Index Cond: ((parent_id = %d) AND (parent_fanout = 2))", parent),
		"both columns in the index condition")
	n, plan = children(0)
	require.Equal(t, 5, n)
	require.Contains(t, plan, "using gendurable_instances_parent_fanout")
	require.Contains(t, plan, fmt.Sprintf("Index Cond: (parent_id = %d)", parent), "parent_id alone is still an index lookup")

	res, err = migrate.To(ctx, pool, schema, 4)
	require.NoError(t, err)
	require.Equal(t, reversed(allVersions()[4:]), res.Applied)
	require.Equal(t, map[string]string{
		"gendurable_instances_parent": " USING btree (parent_id) WHERE (parent_id IS NOT NULL)",
	}, parentIndexes())
	n, _ = children(0)
	require.Equal(t, 5, n, "down keeps the rows")
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
}

// TestUpgradeTo6KeepsInFlightKeyedClaims: a keyed row claimed under version
// 5 (by an engine holding the key's session lock) keeps its key's slot
// across the upgrade to key leases: the new pick claims no other row of the
// key while that lease is live, and does once it has run out. Down to 5 and
// up again keeps every row.
func TestUpgradeTo6KeepsInFlightKeyedClaims(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := migrate.To(ctx, pool, schema, 5)
	require.NoError(t, err)
	var holder int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances
		(fsm, step, status, partition_key, claim_token, lease_expires_at)
		VALUES ('m', 'a', 'executing', 'acct', 7, now() + interval '1 hour') RETURNING id`).Scan(&holder))
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, partition_key)
		VALUES ('m', 'a', 'acct'), ('m', 'a', 'acct'), ('m', 'a', NULL)`)
	require.NoError(t, err)

	res, err := migrate.To(ctx, pool, schema, 6)
	require.NoError(t, err)
	require.Equal(t, []int{6}, res.Applied)
	// This library's pick calls the overload of version 11 (the floor); its
	// keyed part is version 6's key leases.
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	picked, err := q.Pick(ctx, pool, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
	got := picked.Claimed
	require.NoError(t, err)
	require.Len(t, got, 1, "only the plain row: acct's slot is held by the claim from before the upgrade")
	require.Nil(t, got[0].PartitionKey)

	_, err = pool.Exec(ctx, `UPDATE `+s+`.gendurable_instances SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, holder)
	require.NoError(t, err)
	picked, err = q.Pick(ctx, pool, "default", sqlq.PickOpts{Limit: 10, Lease: time.Minute})
	got = picked.Claimed
	require.NoError(t, err)
	require.Len(t, got, 1, "the lapsed lease freed acct's one slot")
	require.Equal(t, "acct", *got[0].PartitionKey)

	_, err = migrate.To(ctx, pool, schema, 5)
	require.NoError(t, err)
	_, err = migrate.To(ctx, pool, schema, 6)
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.gendurable_instances`).Scan(&n))
	require.Equal(t, 4, n)
}

// TestVersions12And13ReplaceThePickInPlace: versions 12 (fair share), 13
// (the cursor passes a key holding more than the keys served) and 14 (rows
// cancelled mid-step count against GlobalConcurrency) each replace the body
// of version 11's twelve-argument pick, keeping its signature (an engine of
// the version before still running picks through it); going down a version
// puts the previous body back, byte for byte.
func TestVersions12And13ReplaceThePickInPlace(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	body := func() (src string, overloads int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT max(p.prosrc) FILTER (WHERE p.pronargs = 12), count(*)
			FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
			WHERE p.proname = 'gendurable_pick' AND n.nspname = $1`, schema).Scan(&src, &overloads))
		return src, overloads
	}
	_, err := migrate.To(ctx, pool, schema, 11)
	require.NoError(t, err)
	prev, n := body()
	require.Equal(t, 2, n)
	for _, step := range []struct {
		version int
		marker  string
	}{{12, "fair share"}, {13, "the most any key that got a share now holds"}, {14, "cancelled mid-step"}} {
		_, err = migrate.To(ctx, pool, schema, step.version)
		require.NoError(t, err)
		next, n := body()
		require.Equal(t, 2, n, "version %d replaced in place: no new overload", step.version)
		require.NotEqual(t, prev, next)
		require.Contains(t, next, step.marker)
		_, err = migrate.To(ctx, pool, schema, step.version-1)
		require.NoError(t, err)
		back, n := body()
		require.Equal(t, 2, n)
		require.Equal(t, prev, back, "down to %d restores its pick", step.version-1)
		_, err = migrate.To(ctx, pool, schema, step.version)
		require.NoError(t, err)
		prev = next
	}
}

// TestUpgradeTo11KeepsThePreviousPick: version 11 adds the pick's floor as a
// new overload of gendurable_pick; the ten-argument function of version 9
// stays, so engines of the previous version keep picking during a rolling
// upgrade. Going below 11 drops the overload only.
func TestUpgradeTo11KeepsThePreviousPick(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := migrate.To(ctx, pool, schema, 9)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step) SELECT 'm', 'a' FROM generate_series(1, 3)`)
	require.NoError(t, err)
	oldPick := func() int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(p.c) FROM `+s+`.gendurable_pick('default', 1, 60000000, '',
			'{}', '{}', '{}', '{}', 20, 0) AS p`).Scan(&n))
		return n
	}
	require.Equal(t, 1, oldPick())
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, 1, oldPick(), "version 9's pick still works at version 11")
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	res, err := q.Pick(ctx, pool, "default", sqlq.PickOpts{Limit: 5, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.NotNil(t, res.Floor, "the overload returns the next floor")

	_, err = migrate.To(ctx, pool, schema, 9)
	require.NoError(t, err)
	var overloads int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname = 'gendurable_pick'
		AND pronamespace = $1::regnamespace`, s).Scan(&overloads))
	require.Equal(t, 1, overloads)
}

// TestUpgradeTo18PicksOnASessionThatPickedBefore: version 18 adds a column
// to the instances table and replaces gendurable_pick's body in place: on a
// connection that ran version 17's pick before the migration (its compiled
// function cached there), the new pick returns the whole row with the new
// column after it, and a row parked by version 17 (no inbox_seen) is
// claimed as before. Down to 17 drops the column, and the pick still runs
// on that connection.
func TestUpgradeTo18PicksOnASessionThatPickedBefore(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := migrate.To(ctx, pool, schema, 17)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, awaits) SELECT 'm', 'a', '{}' FROM generate_series(1, 3)`)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dbtest.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	pick := `SELECT count(p.c) FROM ` + s + `.gendurable_pick('default', 1, 60000000, '',
		'{}', '{}', '{}', '{}', 20, 0, NULL, '{}') AS p`
	var n int
	require.NoError(t, conn.QueryRow(ctx, pick).Scan(&n))
	require.Equal(t, 1, n)
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	res, err := q.Pick(ctx, conn, "default", sqlq.PickOpts{Limit: 1, Lease: time.Minute})
	require.NoError(t, err, "the new pick on the session that picked before")
	require.Len(t, res.Claimed, 1)
	require.Equal(t, []string{}, res.Claimed[0].Awaits)
	require.Nil(t, res.Claimed[0].Seen, "a row parked before the upgrade has no ids")
	_, err = migrate.To(ctx, pool, schema, 17)
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(ctx, pick).Scan(&n), "version 17's pick after the column went")
	require.Equal(t, 1, n)
}

// TestUpgradeTo23KeepsThePreviousPick: version 23 adds the bound on keyed
// rows as a new overload of gendurable_pick; the twelve-argument function
// engines of version 22 call stays, and claims keyed rows as before. Down
// to 22 drops the overload only.
func TestUpgradeTo23KeepsThePreviousPick(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := migrate.To(ctx, pool, schema, 22)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step, partition_key) SELECT 'm', 'a', 'k' || g FROM generate_series(1, 6) g`)
	require.NoError(t, err)
	oldPick := func() int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(p.c) FROM `+s+`.gendurable_pick('default', 2, 60000000, '',
			'{}', '{}', '{}', '{}', 20, 0, NULL, '{}') AS p`).Scan(&n))
		return n
	}
	overloads := func() int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname = 'gendurable_pick'
			AND pronamespace = $1::regnamespace`, s).Scan(&n))
		return n
	}
	before := overloads()
	require.Equal(t, 2, oldPick())
	_, err = migrate.To(ctx, pool, schema, 23)
	require.NoError(t, err)
	require.Equal(t, 2, oldPick(), "version 22's pick still claims keyed rows at version 23")
	require.Equal(t, before+1, overloads())
	q, err := sqlq.New(schema)
	require.NoError(t, err)
	res, err := q.Pick(ctx, pool, "default", sqlq.PickOpts{Limit: 2, Lease: time.Minute, Keyed: 1})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1, "the new pick's bound")
	_, err = migrate.To(ctx, pool, schema, 22)
	require.NoError(t, err)
	require.Equal(t, before, overloads())
	require.Equal(t, 1, oldPick(), "version 22's pick after the way down")
}

// TestInstancesAutovacuumByDeadRows: version 8 sets the instances table's
// autovacuum to start at 10,000 dead rows whatever its size (BENCHMARKS.md,
// "Long horizon — storage experiments"); going below it restores the
// server's settings.
func TestInstancesAutovacuumByDeadRows(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	reloptions := func() []string {
		t.Helper()
		var opts []string
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = to_regclass($1)`,
			`"`+schema+`".gendurable_instances`).Scan(&opts))
		return opts
	}
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=10000"}, reloptions())
	_, err = migrate.To(ctx, pool, schema, 6)
	require.NoError(t, err)
	require.Empty(t, reloptions())
}

// TestReinstallKeepsClaimTokensGrowing: a claim's token is its fencing
// token, and "every claim draws a larger one" must hold across a Down and
// an Up of the schema too. Starting the sequence at 1 again gave the new
// instances (ids from 1 again) the old claims' (id, token) pairs: a step of
// an engine still running across the reinstall wrote its late outcome onto
// the new instance of the same id (marking it done while its own step still
// ran), and a resource fencing by token refused every write of the new runs.
func TestReinstallKeepsClaimTokensGrowing(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, nil)
	ctx := context.Background()
	var old int64
	for range 1000 { // claims of the first install
		require.NoError(t, pool.QueryRow(ctx, `SELECT nextval('"`+schema+`".gendurable_claim_token_seq')`).Scan(&old))
	}
	_, err := migrate.Down(ctx, pool, schema)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	var fresh int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT nextval('"`+schema+`".gendurable_claim_token_seq')`).Scan(&fresh))
	require.Greater(t, fresh, old, "the reinstalled schema's first claim token is larger than the last one of the previous install")
	require.Less(t, fresh, int64(1)<<53, "tokens stay exact as JSON numbers (the dashboard's JavaScript)")
}

// TestUpByTheSchemaOwnerWithoutCreateOnTheDatabase: a role that owns its
// schema but may not create schemas in the database (no CREATE on it, the
// default for a role that does not own the database) migrates its schema.
// Up ran CREATE SCHEMA IF NOT EXISTS first, which PostgreSQL refuses
// without that privilege even when the schema exists: every Up failed,
// also one with nothing to do on every start.
func TestUpByTheSchemaOwnerWithoutCreateOnTheDatabase(t *testing.T) {
	t.Parallel()
	conn, schema := schemaOwnerWithoutCreate(t)
	ctx := context.Background()
	res, err := migrate.Up(ctx, conn, schema)
	require.NoError(t, err)
	require.Equal(t, allVersions(), res.Applied)
	res, err = migrate.Up(ctx, conn, schema)
	require.NoError(t, err)
	require.Empty(t, res.Applied)
	_, err = migrate.Down(ctx, conn, schema)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, conn, schema+"_other")
	require.Error(t, err, "a schema that does not exist still needs the privilege")
}

// TestPrintedSQLRunsForTheSchemaOwnerWithoutCreateOnTheDatabase: the script
// `gendurable migrate print` writes, applied by a role that owns its schema
// but may not create schemas. It began with CREATE SCHEMA IF NOT EXISTS,
// which PostgreSQL refuses without the privilege even when the schema
// exists (42501), and a down script carried it too.
func TestPrintedSQLRunsForTheSchemaOwnerWithoutCreateOnTheDatabase(t *testing.T) {
	t.Parallel()
	conn, schema := schemaOwnerWithoutCreate(t)
	ctx := context.Background()
	up, err := migrate.SQL(schema, 0, migrate.Latest())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, up)
	require.NoError(t, err)
	v, err := migrate.Installed(ctx, conn, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v)

	down, err := migrate.SQL(schema, migrate.Latest(), 0)
	require.NoError(t, err)
	require.NotContains(t, down, "CREATE SCHEMA", "a down script creates nothing")
	last := allVersions()[len(allVersions())-2]
	step, err := migrate.SQL(schema, last, migrate.Latest())
	require.NoError(t, err)
	require.NotContains(t, step, "CREATE SCHEMA", "only an install from version 0 may need the schema")
	same, err := migrate.SQL(schema, last, last)
	require.NoError(t, err)
	require.Empty(t, same)
	_, err = conn.Exec(ctx, down)
	require.NoError(t, err)
	v, err = migrate.Installed(ctx, conn, schema)
	require.NoError(t, err)
	require.Zero(t, v)

	other, err := migrate.SQL(schema+"_other", 0, migrate.Latest())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, other)
	require.Error(t, err, "a schema that does not exist still needs the privilege")
}

// schemaOwnerWithoutCreate makes a fresh schema owned by a new login role
// that may not create schemas in the database, and returns a connection as
// that role.
func schemaOwnerWithoutCreate(t *testing.T) (*pgx.Conn, string) {
	t.Helper()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	role := schema + "_owner"
	_, err := pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD 'gdtest'`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		_, _ = pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
	})
	_, err = pool.Exec(ctx, `ALTER SCHEMA `+schema+` OWNER TO `+role)
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	cfg.User, cfg.Password = role, "gdtest"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var mayCreate bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT has_database_privilege(current_database(), 'CREATE')`).Scan(&mayCreate))
	require.False(t, mayCreate, "the role may not create schemas")
	return conn, schema
}

// TestMigrationBehindABlockerDoesNotStallTheWorkers: a migration whose
// ALTER TABLE waits for another transaction's lock on the instances table
// (a long report, a caller's open InsertTx) waits at most
// sqlq.MigrateLockWait at a time, then lets the statements queued behind
// its lock request through and tries again, and is applied once the
// blocker ends. Before, it waited for as long as the blocker, and every
// worker's statement on the table queued behind it (a probe: 24 s without
// a step, every running step's lease lost).
func TestMigrationBehindABlockerDoesNotStallTheWorkers(t *testing.T) {
	t.Parallel()
	pool, schema, blocker := behindABlocker(t)
	ctx := context.Background()

	migrated := make(chan error, 1)
	go func() {
		_, err := migrate.Up(ctx, pool, schema)
		migrated <- err
	}()
	time.Sleep(500 * time.Millisecond) // the migration waits for its lock
	// A worker's statement, queued behind the migration's lock request,
	// goes through within a lock wait.
	start := time.Now()
	var n int
	qctx, cancel := context.WithTimeout(ctx, sqlq.MigrateLockWait+2*time.Second)
	defer cancel()
	require.NoError(t, pool.QueryRow(qctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances`).Scan(&n),
		"the statement waited for the blocker")
	waited := time.Since(start)
	t.Logf("a statement behind the waiting migration took %v", waited.Round(time.Millisecond))
	require.Less(t, waited, sqlq.MigrateLockWait+time.Second, "the statement waited for the blocker")
	select {
	case err := <-migrated:
		t.Fatalf("the migration ended while the blocker held its lock: %v", err)
	default:
	}
	require.NoError(t, blocker.Rollback(ctx))
	select {
	case err := <-migrated:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("the migration was not applied once the blocker ended")
	}
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v)
}

// TestMigrationGivesUpWithItsContext: a migration that keeps meeting a
// lock another transaction holds stops trying when its context ends, and
// has applied nothing.
func TestMigrationGivesUpWithItsContext(t *testing.T) {
	t.Parallel()
	pool, schema, _ := behindABlocker(t)
	ctx := context.Background()
	mctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err := migrate.Up(mctx, pool, schema)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, alteringVersion-1, v)
}

// TestASchemaItCannotReadIsErrSchemaVersion: a schema at a version newer
// than the library's, or whose version comment was lost (a dump restored
// with --no-comments), is gendurable.ErrSchemaVersion (migrate's too), with
// the fix in the text; before, an untyped error a process could not tell
// apart from a connection failure.
func TestASchemaItCannotReadIsErrSchemaVersion(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	q := `"` + schema + `".gendurable_instances`
	_, err := pool.Exec(ctx, fmt.Sprintf(`COMMENT ON TABLE %s IS 'gendurable schema version %d'`, q, migrate.Latest()+1))
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema)
	require.ErrorIs(t, err, migrate.ErrSchemaVersion)
	require.ErrorIs(t, err, gendurable.ErrSchemaVersion)
	require.ErrorContains(t, err, "upgrade this process's gendurable")

	_, err = pool.Exec(ctx, `COMMENT ON TABLE `+q+` IS NULL`)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema)
	require.ErrorIs(t, err, gendurable.ErrSchemaVersion)
	require.ErrorContains(t, err, "COMMENT ON TABLE")
	_, err = migrate.Installed(ctx, pool, schema)
	require.ErrorIs(t, err, gendurable.ErrSchemaVersion)
}

// alteringVersion is the latest schema version that alters the instances
// table (019 adds two columns); later ones (020 adds a function) take no
// lock a reader of the table holds up.
const alteringVersion = 19

// behindABlocker is a schema one version behind alteringVersion, and a
// transaction that holds a lock on its instances table (as a long report would), rolled
// back when the test ends if the test has not ended it.
func behindABlocker(t *testing.T) (*pgxpool.Pool, string, pgx.Tx) {
	t.Helper()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 4})
	ctx := context.Background()
	_, err := migrate.To(ctx, pool, schema, alteringVersion-1)
	require.NoError(t, err)
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = blocker.Rollback(context.Background()) })
	_, err = blocker.Exec(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances`)
	require.NoError(t, err)
	return pool, schema, blocker
}

// TestUpToAndDownToMoveOneWayOnly: UpTo never moves a schema down, DownTo
// never up (ErrDirection, nothing applied); each moves its own way as To.
func TestUpToAndDownToMoveOneWayOnly(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	last := migrate.Latest()
	res, err := migrate.UpTo(ctx, pool, schema, last-1)
	require.NoError(t, err)
	require.Equal(t, last-1, res.To)
	_, err = migrate.DownTo(ctx, pool, schema, last)
	require.ErrorIs(t, err, migrate.ErrDirection)
	res, err = migrate.UpTo(ctx, pool, schema, last)
	require.NoError(t, err)
	require.Equal(t, []int{last}, res.Applied)
	res, err = migrate.UpTo(ctx, pool, schema, last-1)
	require.ErrorIs(t, err, migrate.ErrDirection)
	require.Equal(t, migrate.Result{From: last, To: last}, res)
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, last, v, "nothing applied")
	res, err = migrate.DownTo(ctx, pool, schema, last-1)
	require.NoError(t, err)
	require.Equal(t, []int{last}, res.Applied)
	res, err = migrate.UpTo(ctx, pool, schema, last-1)
	require.NoError(t, err, "already there")
	require.Empty(t, res.Applied)
}

// TestAnUpgradeOverSeveralVersionsKeepsThoseItCommitted: Up applies one
// version per transaction, so one that cannot get a later version's lock
// keeps the versions it applied before it (and held no lock of theirs
// while it waited). Version 14 builds an index, whose lock a writer's open
// transaction holds off; versions 8–13 take no lock a writer conflicts with.
func TestAnUpgradeOverSeveralVersionsKeepsThoseItCommitted(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	ctx := context.Background()
	_, err := migrate.To(ctx, pool, schema, 7)
	require.NoError(t, err)
	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = writer.Rollback(context.Background()) })
	_, err = writer.Exec(ctx, `LOCK TABLE "`+schema+`".gendurable_instances IN ROW EXCLUSIVE MODE`)
	require.NoError(t, err)

	mctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	res, err := migrate.Up(mctx, pool, schema)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "stopped at version 13")
	require.Equal(t, migrate.Result{From: 7, To: 13, Applied: []int{8, 9, 10, 11, 12, 13}}, res)
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, 13, v, "the versions applied before the blocked one were kept")

	require.NoError(t, writer.Rollback(ctx))
	res, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, 13, res.From)
	require.Equal(t, migrate.Latest(), res.To)
	require.Equal(t, 14, res.Applied[0])

	// Down goes one version at a time too, each leaving its comment.
	res, err = migrate.To(ctx, pool, schema, 12)
	require.NoError(t, err)
	require.Equal(t, 12, res.To)
	require.Equal(t, reversed(allVersions())[:migrate.Latest()-12], res.Applied)
	v, err = migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, 12, v)
}

// TestAnInvalidPrebuiltIndexStopsItsVersion: the migrations that build an
// index "IF NOT EXISTS" (so an operator may build it CONCURRENTLY first)
// refuse one of that name left invalid by a failed concurrent build — kept,
// it would never be used — and apply once it is dropped.
func TestAnInvalidPrebuiltIndexStopsItsVersion(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	_, err := migrate.To(ctx, pool, schema, 13)
	require.NoError(t, err)
	q := `"` + schema + `".gendurable_instances`
	_, err = pool.Exec(ctx, `INSERT INTO `+q+` (fsm, step) VALUES ('m', 's'), ('m', 's')`)
	require.NoError(t, err)
	// Unique over two equal values: the concurrent build fails and leaves
	// its index invalid, under the name version 14 builds.
	_, err = pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY gendurable_instances_lingering_leases ON `+q+` (queue)`)
	require.Error(t, err)

	_, err = migrate.Up(ctx, pool, schema)
	require.ErrorContains(t, err, "gendurable_instances_lingering_leases")
	require.ErrorContains(t, err, "not valid")
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, 13, v)

	_, err = pool.Exec(ctx, `DROP INDEX "`+schema+`".gendurable_instances_lingering_leases`)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	var valid bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)`,
		`"`+schema+`".gendurable_instances_lingering_leases`).Scan(&valid))
	require.True(t, valid)
}

// TestAMigrationThatCannotConnectReportsVersionZero: a migration whose
// first transaction cannot begin read no version: its Result is the zero
// one, as before migrations went a version per transaction (whose "no
// version left yet" is -1 inside).
func TestAMigrationThatCannotConnectReportsVersionZero(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?connect_timeout=2")
	require.NoError(t, err)
	defer pool.Close()
	res, err := migrate.Up(context.Background(), pool, "nowhere")
	require.Error(t, err)
	require.Equal(t, migrate.Result{}, res)
}

// TestAVersionStampWaitsPastTheDeadlockTimeout (docs/design.md §6,
// "Migrations wait briefly for locks"): a version's stamp needs SHARE
// UPDATE EXCLUSIVE on the instances table — which an autovacuum of the
// table holds, and no worker statement waits behind — and waits for it past
// the server's deadlock_timeout, when PostgreSQL cancels an autovacuum that
// blocks a lock request, whatever the session's lock_timeout (here 1 s, the
// default deadlock_timeout, as a role might set it). Waiting MigrateLockWait
// (0.5 s) at a time, or the session's 1 s, it never got the autovacuum
// cancelled and waited for it to end (a probe: 45 s). An autovacuum cannot
// be made to run on cue here, so the blocker is a session holding that
// lock until the stamp has waited deadlock_timeout + 300 ms: version 21,
// whose stamp is its only contended lock, waits that long in one request.
func TestAVersionStampWaitsPastTheDeadlockTimeout(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 4})
	ctx := context.Background()
	_, err := migrate.To(ctx, pool, schema, 20)
	require.NoError(t, err)
	var ms float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT extract(epoch FROM current_setting('deadlock_timeout')::interval) * 1000`).Scan(&ms))
	deadlock := time.Duration(ms) * time.Millisecond
	if deadlock < 2*sqlq.MigrateLockWait {
		t.Skipf("deadlock_timeout %v: too close to MigrateLockWait to tell the waits apart", deadlock)
	}
	// The migrator's own pool, with a session lock_timeout of 1 s.
	cfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "1s"
	migrator, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer migrator.Close()

	table := `"` + schema + `".gendurable_instances`
	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(context.Background()) }()
	_, err = blocker.Exec(ctx, `LOCK TABLE `+table+` IN SHARE UPDATE EXCLUSIVE MODE`)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := migrate.To(ctx, migrator, schema, 21)
		done <- err
	}()
	// Watch the requests waiting for a lock on the table: the first one
	// seen, and how long it waits without a break.
	var first string
	var since time.Time
	var waited time.Duration
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var vxid string
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(max(virtualtransaction), '') FROM pg_locks
			WHERE relation = $1::regclass AND NOT granted`, table).Scan(&vxid))
		now := time.Now()
		if first == "" && vxid != "" {
			first, since = vxid, now
		}
		if first != "" {
			if vxid != first {
				break // it gave up (or was granted: the blocker still holds the lock)
			}
			waited = now.Sub(since)
			if waited >= deadlock+300*time.Millisecond {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, blocker.Commit(ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the migration was not applied once the blocker ended")
	}
	t.Logf("one request waited %v without a break (deadlock_timeout %v)", waited.Round(time.Millisecond), deadlock)
	require.GreaterOrEqual(t, waited, deadlock+300*time.Millisecond, "the stamp gave up before the deadlock timeout had passed")
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, 21, v)
}

// requireVersion checks that schema is installed at version want.
func requireVersion(t *testing.T, pool *pgxpool.Pool, schema string, want int, msg string) {
	t.Helper()
	v, err := migrate.Installed(context.Background(), pool, schema)
	require.NoError(t, err)
	require.Equal(t, want, v, msg)
}

// TestAnIndexNameOnAUsersTableStopsItsVersion: an index of the user's, on
// a table of theirs in the schema, under a name a version builds "if not
// exists" (gendurable_instances_unique_key, version 4) stops that version
// going up — gendurable's index would have been skipped, silently — and
// going down: the down would have dropped the user's index (a
// hostile-operator probe did both). Nothing of the version is applied, and
// the user's index stays.
func TestAnIndexNameOnAUsersTableStopsItsVersion(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	userIndexOn := func(table string) bool {
		var on *string
		require.NoError(t, pool.QueryRow(ctx, `SELECT t.relname::text FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
			WHERE i.indexrelid = to_regclass($1)`, s+`.gendurable_instances_unique_key`).Scan(&on))
		return on != nil && *on == table
	}
	_, err := migrate.To(ctx, pool, schema, 3)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE `+s+`.user_things (id int, k text)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE INDEX gendurable_instances_unique_key ON `+s+`.user_things (k)`)
	require.NoError(t, err)

	_, err = migrate.Up(ctx, pool, schema)
	require.ErrorContains(t, err, "gendurable_instances_unique_key (an index on user_things)")
	require.ErrorContains(t, err, "migration 4 up")
	requireVersion(t, pool, schema, 3, "version 4 was not applied")
	require.True(t, userIndexOn("user_things"))

	// The same name taken after gendurable's index was dropped by hand (or
	// skipped by an older binary): the down of version 4 leaves it alone.
	_, err = pool.Exec(ctx, `DROP INDEX `+s+`.gendurable_instances_unique_key`)
	require.NoError(t, err)
	_, err = migrate.To(ctx, pool, schema, 4)
	require.NoError(t, err)
	require.True(t, userIndexOn("gendurable_instances"))
	_, err = pool.Exec(ctx, `DROP INDEX `+s+`.gendurable_instances_unique_key`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE INDEX gendurable_instances_unique_key ON `+s+`.user_things (k)`)
	require.NoError(t, err)
	_, err = migrate.To(ctx, pool, schema, 3)
	require.ErrorContains(t, err, "migration 4 down")
	requireVersion(t, pool, schema, 4, "version 4 was not removed")
	require.True(t, userIndexOn("user_things"), "the user's index was kept")
}

// TestANameVersionsFreeIsTheUsersOnceFreed (a review of the test above):
// version 5 drops gendurable_instances_parent going up and builds it again
// going down. Once freed, the name may be taken by an index of the user's:
// the down must not skip gendurable's index, and the next up must not drop
// the user's. A view of a name a version builds "if not exists" must not
// make it skip the build either.
func TestANameVersionsFreeIsTheUsersOnceFreed(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := migrate.To(ctx, pool, schema, 5)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE `+s+`.user_things (id int, k text)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE INDEX gendurable_instances_parent ON `+s+`.user_things (k)`)
	require.NoError(t, err)
	_, err = migrate.To(ctx, pool, schema, 4)
	require.ErrorContains(t, err, "gendurable_instances_parent (an index on user_things)")
	require.ErrorContains(t, err, "migration 5 down")
	requireVersion(t, pool, schema, 5, "version 5 was not removed")
	// An older binary's down skipped the build: the name is the user's at
	// version 4; version 5's up must not drop it.
	_, err = pool.Exec(ctx, `DROP INDEX `+s+`.gendurable_instances_parent`)
	require.NoError(t, err)
	_, err = migrate.To(ctx, pool, schema, 4)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DROP INDEX `+s+`.gendurable_instances_parent`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE INDEX gendurable_instances_parent ON `+s+`.user_things (k)`)
	require.NoError(t, err)
	_, err = migrate.To(ctx, pool, schema, 5)
	require.ErrorContains(t, err, "migration 5 up")
	requireVersion(t, pool, schema, 4, "version 5 was not applied")
	var kept bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s+`.gendurable_instances_parent`).Scan(&kept))
	require.True(t, kept, "the user's index was kept")

	// A view under a name version 14 builds "if not exists".
	_, err = pool.Exec(ctx, `DROP INDEX `+s+`.gendurable_instances_parent`)
	require.NoError(t, err)
	_, err = migrate.To(ctx, pool, schema, 13)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE VIEW `+s+`.gendurable_instances_lingering_leases AS SELECT 1 AS x`)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema)
	require.ErrorContains(t, err, "gendurable_instances_lingering_leases (not an index)")
	requireVersion(t, pool, schema, 13, "version 14 was not applied")
}

// TestAColumnNameOfTheUsersStopsItsVersion: a column of the user's on
// gendurable's table, under a name a version adds "if not exists"
// (inbox_seen, version 18), stops that version going up: ADD COLUMN IF NOT
// EXISTS took it over as gendurable's (a hostile-operator probe: a text
// inbox_seen, and the upgrade said version 22 while every pick failed on
// its type), and a later down dropped it with its data. The versions before
// it are applied; the user's column and its data stay, through a down too.
func TestAColumnNameOfTheUsersStopsItsVersion(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := migrate.To(ctx, pool, schema, 16)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ALTER TABLE `+s+`.gendurable_instances ADD COLUMN inbox_seen text DEFAULT 'mine'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step) VALUES ('m', 'a')`)
	require.NoError(t, err)
	userColumn := func() string {
		var typ string
		require.NoError(t, pool.QueryRow(ctx, `SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
			WHERE a.attrelid = to_regclass($1) AND a.attname = 'inbox_seen' AND NOT a.attisdropped`,
			s+`.gendurable_instances`).Scan(&typ))
		var mine int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.gendurable_instances WHERE inbox_seen = 'mine'`).Scan(&mine))
		require.Equal(t, 1, mine, "the user's data is kept")
		return typ
	}

	_, err = migrate.Up(ctx, pool, schema)
	require.ErrorContains(t, err, "migration 18 up: column gendurable_instances.inbox_seen")
	require.ErrorContains(t, err, "nothing of version 18 was applied")
	requireVersion(t, pool, schema, 17, "version 17 was applied, 18 was not")
	require.Equal(t, "text", userColumn())

	_, err = migrate.To(ctx, pool, schema, 16)
	require.NoError(t, err)
	require.Equal(t, "text", userColumn(), "17's down leaves the user's column alone")

	// Renamed, the upgrade goes through, and a down and up again are gendurable's own.
	_, err = pool.Exec(ctx, `ALTER TABLE `+s+`.gendurable_instances RENAME COLUMN inbox_seen TO my_seen`)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	_, err = migrate.To(ctx, pool, schema, 20)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err, "021's down runs 018's up again on gendurable's own column")
}

// TestAnUpRefusesATableNameTakenBeforeItsFirstVersion: a schema holding
// an application's own table named gendurable_queues (version 3 creates
// one) was half installed: versions 1 and 2 committed, then version 3
// stopped on the name (a probe). The up refuses before its first version,
// naming the table and the version; nothing is applied, the application's
// table is untouched; renamed, the install goes through. A printed script
// refuses it with the same message (it went on to version 2 before).
func TestAnUpRefusesATableNameTakenBeforeItsFirstVersion(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s+`;
		CREATE TABLE `+s+`.gendurable_queues (app_id int); INSERT INTO `+s+`.gendurable_queues VALUES (7)`)
	require.NoError(t, err)

	_, err = migrate.Up(ctx, pool, schema)
	msg := fmt.Sprintf("migration 3 up: gendurable_queues in schema %q exists already, and not from gendurable (version 3 creates it)", schema)
	require.ErrorContains(t, err, msg)
	require.ErrorContains(t, err, "nothing was applied")
	requireVersion(t, pool, schema, 0, "not even version 1")
	// The printed script refuses it the same way, in its first version.
	script, err := migrate.SQL(schema, 0, migrate.Latest())
	require.NoError(t, err)
	_, err = pool.Exec(ctx, script)
	require.ErrorContains(t, err, msg)
	requireVersion(t, pool, schema, 0, "not even version 1 of the script")
	var mine int
	require.NoError(t, pool.QueryRow(ctx, `SELECT app_id FROM `+s+`.gendurable_queues`).Scan(&mine))
	require.Equal(t, 7, mine, "the application's table is untouched")

	_, err = pool.Exec(ctx, `ALTER TABLE `+s+`.gendurable_queues RENAME TO app_queues`)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	requireVersion(t, pool, schema, migrate.Latest(), "installed once renamed")
}

// TestADownThatWouldDropSomethingElsewhereIsRefused: a constraint trigger
// on a table of the user's declared FROM gendurable_instances depends on it
// automatically, and DROP TABLE … RESTRICT drops such an object without a
// word (a hostile-operator probe: migrate down to 0 removed the trigger).
// The down is refused before its first version, nothing applied, the
// trigger kept; a down that drops no table goes through; statistics
// elsewhere on a column a version drops are refused too; a trigger or a
// policy on gendurable's own table does not hold a down up.
func TestADownThatWouldDropSomethingElsewhereIsRefused(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, nil)
	ctx := context.Background()
	s := `"` + schema + `"`
	ledger := `public."` + schema + `_ledger"`
	fn := `public."` + schema + `_chk"`
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+ledger+`; DROP FUNCTION IF EXISTS `+fn+`()`)
	})
	_, err := pool.Exec(ctx, `CREATE TABLE `+ledger+` (id int);
		CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
		CREATE CONSTRAINT TRIGGER guard AFTER INSERT ON `+ledger+` FROM `+s+`.gendurable_instances
		  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)
	require.NoError(t, err)
	latest := migrate.Latest()

	_, err = migrate.Down(ctx, pool, schema)
	require.ErrorContains(t, err, fmt.Sprintf("migration %d down: objects that are not gendurable's depend on its tables: trigger guard on public.%s_ledger (on gendurable_instances)", latest, schema))
	requireVersion(t, pool, schema, latest, "nothing of the down was applied")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgname = 'guard'
		AND tgrelid = to_regclass($1)`, ledger).Scan(&n))
	require.Equal(t, 1, n, "the trigger is kept")

	_, err = migrate.To(ctx, pool, schema, latest-1)
	require.NoError(t, err, "a version that drops no table goes down")

	// Statistics elsewhere on a column a version drops (inbox_seen, 18) are
	// refused the same way (a review); a trigger and a policy on
	// gendurable's own table are inside the schema, and go with it.
	stats := `public."` + schema + `_st"`
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP STATISTICS IF EXISTS `+stats) })
	_, err = pool.Exec(ctx, `CREATE STATISTICS `+stats+` ON inbox_seen, queue FROM `+s+`.gendurable_instances`)
	require.NoError(t, err)
	_, err = migrate.To(ctx, pool, schema, 17)
	require.ErrorContains(t, err, "statistics object public."+schema+"_st (on gendurable_instances.inbox_seen)")
	requireVersion(t, pool, schema, latest-1, "nothing of the down was applied")
	_, err = pool.Exec(ctx, `DROP STATISTICS `+stats+`; DROP TABLE `+ledger+`;
		CREATE TRIGGER audit AFTER INSERT ON `+s+`.gendurable_instances FOR EACH STATEMENT EXECUTE FUNCTION `+fn+`();
		CREATE POLICY mine ON `+s+`.gendurable_instances USING (true)`)
	require.NoError(t, err)
	_, err = migrate.Down(ctx, pool, schema)
	require.NoError(t, err, "what is on gendurable's own tables goes with them")
	requireVersion(t, pool, schema, 0, "down to 0")
}

// TestADownThatAViewOrAForeignKeyWouldStopIsRefusedFirst: a view on
// gendurable's tables, or a foreign key of another table to one, makes a
// DROP TABLE (or DROP COLUMN) … RESTRICT of a down fail. Before, a down to
// 0 reverted every version above 1 and failed there, leaving the schema at
// version 1 (a hostile-operator probe); now it is refused before its first
// version, naming them, nothing applied — a view in gendurable's own
// schema, one elsewhere, one on a column a version drops, and a foreign
// key alike.
func TestADownThatAViewOrAForeignKeyWouldStopIsRefusedFirst(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, nil)
	ctx := context.Background()
	s := `"` + schema + `"`
	outside := `public."` + schema + `_v"`
	refs := `public."` + schema + `_refs"`
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP VIEW IF EXISTS `+outside+`; DROP TABLE IF EXISTS `+refs)
	})
	latest := migrate.Latest()
	for _, c := range []struct{ create, drop, want string }{
		{`CREATE VIEW ` + outside + ` AS SELECT id, status FROM ` + s + `.gendurable_instances`, `DROP VIEW ` + outside,
			"view public." + schema + "_v (on gendurable_instances)"},
		{`CREATE VIEW ` + s + `.my_view AS SELECT count(*) FROM ` + s + `.gendurable_signals`, `DROP VIEW ` + s + `.my_view`,
			"view " + schema + ".my_view (on gendurable_signals)"},
		{`CREATE TABLE ` + refs + ` (instance bigint REFERENCES ` + s + `.gendurable_instances (id))`, `DROP TABLE ` + refs,
			"on public." + schema + "_refs (on gendurable_instances)"},
		// What the server refuses besides (a review; a trial of the downs
		// in a savepoint finds them): a view named like gendurable's own,
		// a function with a SQL-standard body, a column of a table's row
		// type, a policy on another table.
		{`CREATE VIEW ` + s + `.gendurable_my_report AS SELECT id FROM ` + s + `.gendurable_instances`,
			`DROP VIEW ` + s + `.gendurable_my_report`, "view " + schema + ".gendurable_my_report depends on table"},
		{`CREATE FUNCTION public."` + schema + `_f"() RETURNS bigint LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM ` + s + `.gendurable_instances; END`,
			`DROP FUNCTION public."` + schema + `_f"()`, "function " + schema + "_f() depends on table"},
		{`CREATE TABLE ` + refs + ` (r ` + s + `.gendurable_signals)`, `DROP TABLE ` + refs,
			"column r of table " + schema + "_refs depends on type"},
		{`CREATE TABLE ` + refs + ` (id bigint); CREATE POLICY pp ON ` + refs + ` USING (id IN (SELECT id FROM ` + s + `.gendurable_instances))`,
			`DROP TABLE ` + refs, "policy pp on table " + schema + "_refs depends on table"},
	} {
		_, err := pool.Exec(ctx, c.create)
		require.NoError(t, err)
		_, err = migrate.Down(ctx, pool, schema)
		require.ErrorIs(t, err, migrate.ErrDependents, c.create)
		require.ErrorContains(t, err, c.want)
		requireVersion(t, pool, schema, latest, "nothing of the down was applied")
		_, err = pool.Exec(ctx, c.drop)
		require.NoError(t, err)
	}
	// A view on a column a version drops (inbox_seen, added by 18) stops
	// a down past 18, not one to 18.
	_, err := pool.Exec(ctx, `CREATE VIEW `+outside+` AS SELECT inbox_seen FROM `+s+`.gendurable_instances`)
	require.NoError(t, err)
	_, err = migrate.To(ctx, pool, schema, 17)
	require.ErrorContains(t, err, "view public."+schema+"_v (on gendurable_instances.inbox_seen)")
	requireVersion(t, pool, schema, latest, "nothing of the down was applied")
	_, err = migrate.To(ctx, pool, schema, 18)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DROP VIEW `+outside)
	require.NoError(t, err)
	_, err = migrate.Down(ctx, pool, schema)
	require.NoError(t, err)
	requireVersion(t, pool, schema, 0, "down to 0")
}

// TestANilContextOrDatabaseIsATypedError: Up, Down, To, UpTo, DownTo and
// Installed refuse a nil context or database with ErrNilArgument; a review
// saw them panic on a nil dereference.
func TestANilContextOrDatabaseIsATypedError(t *testing.T) {
	t.Parallel()
	var nilCtx context.Context
	var nilPool *pgxpool.Pool
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"Up":             func() error { _, err := migrate.Up(nilCtx, nilPool, "x"); return err },
		"Down":           func() error { _, err := migrate.Down(nilCtx, nilPool, "x"); return err },
		"To":             func() error { _, err := migrate.To(nilCtx, nilPool, "x", 1); return err },
		"UpTo":           func() error { _, err := migrate.UpTo(nilCtx, nilPool, "x", 1); return err },
		"DownTo":         func() error { _, err := migrate.DownTo(nilCtx, nilPool, "x", 0); return err },
		"Installed":      func() error { _, err := migrate.Installed(nilCtx, nilPool, "x"); return err },
		"Up, nil pool":   func() error { _, err := migrate.Up(ctx, nilPool, "x"); return err },
		"Installed, nil": func() error { _, err := migrate.Installed(ctx, nil, "x"); return err },
	} {
		var err error
		require.NotPanics(t, func() { err = call() }, name)
		require.ErrorIs(t, err, migrate.ErrNilArgument, name)
	}
}

// TestPrintedScriptsRefuseWhatMigrateRefuses: the scripts of `gendurable
// migrate print` (migrate.SQL), run by a team's own tool, refuse a version
// where migrate up and down would, with the same message and nothing of it
// applied: an index a version builds "if not exists" left invalid by a
// failed concurrent build (the script skipped the build, and every
// statement meant to use the index scanned), a column of the user's under
// a name a version adds (taken over as gendurable's, dropped with its data
// by a later down), statistics elsewhere on a column a down drops (dropped
// with it without a word), and what the server would refuse the downs for
// part way (a function with a SQL-standard body), tried first.
func TestPrintedScriptsRefuseWhatMigrateRefuses(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	script := func(from, to int) error {
		t.Helper()
		sql, err := migrate.SQL(schema, from, to)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, sql) // one implicit transaction
		return err
	}

	// An invalid pre-built index, going up.
	_, err := migrate.To(ctx, pool, schema, 13)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, step) VALUES ('m', 's'), ('m', 's')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY gendurable_instances_lingering_leases ON `+s+`.gendurable_instances (queue)`)
	require.Error(t, err)
	err = script(13, 14)
	require.ErrorContains(t, err, fmt.Sprintf(`migration 14 up: index gendurable_instances_lingering_leases in schema %q is not valid`, schema))
	require.ErrorContains(t, err, "nothing of version 14 was applied")
	requireVersion(t, pool, schema, 13, "the script's version 14 was refused")
	_, err = pool.Exec(ctx, `DROP INDEX `+s+`.gendurable_instances_lingering_leases`)
	require.NoError(t, err)
	require.NoError(t, script(13, 17))
	requireVersion(t, pool, schema, 17, "once the index is dropped, the script goes through")

	// A column of the user's under a name version 18 adds.
	_, err = pool.Exec(ctx, `ALTER TABLE `+s+`.gendurable_instances ADD COLUMN inbox_seen text DEFAULT 'mine'`)
	require.NoError(t, err)
	err = script(17, 18)
	require.ErrorContains(t, err, "migration 18 up: column gendurable_instances.inbox_seen")
	requireVersion(t, pool, schema, 17, "the script's version 18 was refused")
	var mine int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.gendurable_instances WHERE inbox_seen = 'mine'`).Scan(&mine))
	require.Equal(t, 2, mine, "the user's column and its data are kept")
	_, err = pool.Exec(ctx, `ALTER TABLE `+s+`.gendurable_instances DROP COLUMN inbox_seen`)
	require.NoError(t, err)
	latest := migrate.Latest()
	require.NoError(t, script(17, latest))

	// Statistics elsewhere on a column a down drops (inbox_seen, 18).
	stats := `public."` + schema + `_st"`
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP STATISTICS IF EXISTS `+stats) })
	_, err = pool.Exec(ctx, `CREATE STATISTICS `+stats+` ON inbox_seen, queue FROM `+s+`.gendurable_instances`)
	require.NoError(t, err)
	err = script(latest, 17)
	require.ErrorContains(t, err, fmt.Sprintf("migration %d down: objects that are not gendurable's depend on its tables: "+
		"statistics object public.%s_st (on gendurable_instances.inbox_seen)", latest, schema))
	requireVersion(t, pool, schema, latest, "nothing of the down script was applied")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_statistic_ext WHERE stxname = $1`, schema+"_st").Scan(&n))
	require.Equal(t, 1, n, "the statistics are kept")
	_, err = pool.Exec(ctx, `DROP STATISTICS `+stats)
	require.NoError(t, err)

	// What only a trial of the downs finds: a function with a SQL-standard body.
	fn := `public."` + schema + `_f"`
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP FUNCTION IF EXISTS `+fn+`()`) })
	_, err = pool.Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS bigint LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM `+s+`.gendurable_instances; END`)
	require.NoError(t, err)
	err = script(latest, 0)
	require.ErrorContains(t, err, fmt.Sprintf("migration %d down: objects that are not gendurable's depend on its tables: ", latest))
	require.ErrorContains(t, err, "function "+schema+"_f() depends on table")
	requireVersion(t, pool, schema, latest, "nothing of the down script was applied")
	_, err = pool.Exec(ctx, `DROP FUNCTION `+fn+`()`)
	require.NoError(t, err)
	require.NoError(t, script(latest, 0))
	requireVersion(t, pool, schema, 0, "the down script goes through")

	// A name a down drops held by a table of the user's: refused with
	// migrate's message, before the downs' trial fails on it otherwise.
	require.NoError(t, script(0, 14))
	_, err = pool.Exec(ctx, `DROP INDEX `+s+`.gendurable_instances_lingering_leases;
		CREATE TABLE `+s+`.gendurable_instances_lingering_leases (mine int)`)
	require.NoError(t, err)
	err = script(14, 13)
	require.ErrorContains(t, err, fmt.Sprintf(`migration 14 down: gendurable_instances_lingering_leases (not an index) in schema %q: gendurable needs that name`, schema))
	requireVersion(t, pool, schema, 14, "nothing of the down script was applied")
}

// TestAPrintedScriptStartsEachVersionFromItsOwn: each version of a printed
// script is a transaction of its own that first checks the schema is at
// the version it starts from. A script printed --from 22 run on a schema
// at 19 recorded 23 (a probe: versions 20–22 never applied, every pick then
// failed); now version 23 is refused, the schema left at 19. And a down
// script run by psql at its defaults (autocommit, going on after an error)
// stopped at nothing: its first version's check raised, and every down ran
// after it, the user's trigger dropped with the tables; now the check's
// version rolls back and each later one finds the schema not where it
// starts.
func TestAPrintedScriptStartsEachVersionFromItsOwn(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	_, err := migrate.To(ctx, pool, schema, 19)
	require.NoError(t, err)
	latest := migrate.Latest()
	sql, err := migrate.SQL(schema, latest-1, latest)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, sql)
	require.ErrorContains(t, err, fmt.Sprintf(`migration %d up: schema %q is not at version %d, where this version starts `+
		`(its gendurable_instances table says: 'gendurable schema version 19')`, latest, schema, latest-1))
	require.ErrorContains(t, err, fmt.Sprintf("nothing of version %d was applied", latest))
	requireVersion(t, pool, schema, 19, "a script for another starting version is refused")

	psql, err := exec.LookPath("psql")
	require.NoError(t, err, "psql (PostgreSQL's client) runs the printed scripts as a team would")
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	s := `"` + schema + `"`
	ledger := `public."` + schema + `_ledger"`
	fn := `public."` + schema + `_chk"`
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+ledger+`; DROP FUNCTION IF EXISTS `+fn+`()`)
	})
	_, err = pool.Exec(ctx, `CREATE TABLE `+ledger+` (id int);
		CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
		CREATE CONSTRAINT TRIGGER guard AFTER INSERT ON `+ledger+` FROM `+s+`.gendurable_instances
		  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)
	require.NoError(t, err)
	down, err := migrate.SQL(schema, latest, 0)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "down.sql")
	require.NoError(t, os.WriteFile(file, []byte(down), 0o600))
	out, err := exec.CommandContext(ctx, psql, "-X", "-q", "-d", dbtest.URL(), "-f", file).CombinedOutput()
	require.NoError(t, err, "psql at its defaults goes on after an error: %s", out)
	require.Contains(t, string(out), fmt.Sprintf("migration %d down: objects that are not gendurable's depend on its tables", latest))
	require.Contains(t, string(out), fmt.Sprintf("migration %d down: schema %q is not at version %d", latest-1, schema, latest-1))
	requireVersion(t, pool, schema, latest, "no version of the refused down was applied")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgname = 'guard'
		AND tgrelid = to_regclass($1)`, ledger).Scan(&n))
	require.Equal(t, 1, n, "the trigger is kept")
}

// TestADownKeepsAColumnSomeoneAddedToItsTables: a column someone added to a
// table a down drops goes with the table, its data too (a probe: down to 0
// dropped a user's tenant column without a word, where demo's reset
// refuses it). migrate down refuses it before its first version, nothing
// applied, and so does the printed down script; a down that drops no table
// goes through, the column kept.
func TestADownKeepsAColumnSomeoneAddedToItsTables(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := pool.Exec(ctx, `ALTER TABLE `+s+`.gendurable_instances ADD COLUMN tenant text;
		INSERT INTO `+s+`.gendurable_instances (fsm, step, tenant) VALUES ('m', 's', 'acme')`)
	require.NoError(t, err)
	latest := migrate.Latest()
	want := fmt.Sprintf("migration %d down: objects that are not gendurable's depend on its tables: table column %s.gendurable_instances.tenant (on gendurable_instances)", latest, schema)

	_, err = migrate.Down(ctx, pool, schema)
	require.ErrorIs(t, err, migrate.ErrDependents)
	require.ErrorContains(t, err, want)
	requireVersion(t, pool, schema, latest, "nothing of the down was applied")

	down, err := migrate.SQL(schema, latest, 0)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, down)
	require.ErrorContains(t, err, want)
	requireVersion(t, pool, schema, latest, "nothing of the printed down was applied")

	_, err = migrate.To(ctx, pool, schema, latest-1)
	require.NoError(t, err, "a version that drops no table goes down")
	var tenant string
	require.NoError(t, pool.QueryRow(ctx, `SELECT tenant FROM `+s+`.gendurable_instances`).Scan(&tenant))
	require.Equal(t, "acme", tenant)
}

// TestADownKeepsATableThatInheritsFromItsTables: a table of another schema
// declared INHERITS gendurable_instances holds the columns it inherited;
// ALTER TABLE … DROP COLUMN on gendurable's table recurses into it and drops
// them with their data, without a word (a probe: migrate down --to 23
// dropped unconfirmed_freed, values and all, from archive.old_instances).
// migrate down to a version whose downs drop a column refuses it, nothing
// applied, and so does the printed script; the child keeps its data.
func TestADownKeepsATableThatInheritsFromItsTables(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	child := `"` + schema + `_archive"`
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+child+`;
		CREATE TABLE `+child+`.old_instances () INHERITS (`+s+`.gendurable_instances);
		INSERT INTO `+child+`.old_instances (id, fsm, step, unconfirmed_freed) VALUES (900001, 'm', 's', 7)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA `+child+` CASCADE`) })
	latest := migrate.Latest()

	// migrate.Installed refuses such a schema (every command reads the
	// version first): the version is read from the comment here.
	commentVersion := func() string {
		var c string
		require.NoError(t, pool.QueryRow(ctx, `SELECT obj_description(($1 || '.gendurable_instances')::regclass, 'pg_class')`, s).Scan(&c))
		return c
	}
	want := fmt.Sprintf("gendurable schema version %d", latest)
	_, err = migrate.To(ctx, pool, schema, latest-1)
	require.ErrorIs(t, err, migrate.ErrDependents)
	require.ErrorContains(t, err, "old_instances")
	require.Equal(t, want, commentVersion(), "nothing of the down was applied")

	down, err := migrate.SQL(schema, latest, latest-1)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, down)
	require.ErrorContains(t, err, "old_instances")
	require.Equal(t, want, commentVersion(), "nothing of the printed down was applied")

	var freed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT unconfirmed_freed FROM `+child+`.old_instances`).Scan(&freed))
	require.Equal(t, 7, freed, "the inheriting table keeps its column and its data")
}

// TestAPrintedScriptWaitsForMigrate: a printed version's check takes
// migrate's lock first, so a migrate up or down in progress cannot move the
// schema between the check and the version's statements (a review): while
// the lock is held the script waits (here until its lock_timeout), nothing
// applied.
func TestAPrintedScriptWaitsForMigrate(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 3})
	ctx := context.Background()
	latest := migrate.Latest()
	_, err := migrate.To(ctx, pool, schema, latest-1)
	require.NoError(t, err)
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('gendurable.migrate.' || $1::text))`, schema)
	require.NoError(t, err)
	script, err := migrate.SQL(schema, latest-1, latest)
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET lock_timeout = '300ms'`)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.Background(), `RESET lock_timeout`) }()
	_, err = conn.Exec(ctx, script)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "it waited for migrate's lock: %v", err)
	requireVersion(t, pool, schema, latest-1, "nothing applied while migrate held its lock")
	_, err = conn.Exec(ctx, `ROLLBACK`) // the script's failed version left its transaction open
	require.NoError(t, err)
	require.NoError(t, holder.Rollback(ctx))
	_, err = conn.Exec(ctx, script)
	require.NoError(t, err)
	requireVersion(t, pool, schema, latest, "applied once the lock was free")
}

// TestAPrintedScriptLimitsItsIdleAsMigrate: each version of a printed
// script limits its transaction's wait on its client to MigrateIdleLimit,
// as migrate does: a script stopped part way (its client gone quiet after
// a version's ALTER TABLE) held the instances table's exclusive lock, and
// every worker's statements, for as long as the session's own limit.
func TestAPrintedScriptLimitsItsIdleAsMigrate(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	ctx := context.Background()
	latest := migrate.Latest()
	_, err := migrate.To(ctx, pool, schema, latest-1)
	require.NoError(t, err)
	script, err := migrate.SQL(schema, latest-1, latest)
	require.NoError(t, err)
	// The version's statements up to its first ALTER TABLE, then quiet.
	begin := strings.Index(script, "\nBEGIN;\n")
	alter := strings.Index(script, "\nALTER TABLE")
	require.True(t, begin > 0 && alter > begin, "the script has a version with an ALTER TABLE:\n%s", script)
	end := alter + strings.Index(script[alter:], ";\n") + 1
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, script[begin:end])
	require.NoError(t, err)
	var limit string
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&limit))
	require.Equal(t, fmt.Sprintf("%ds", int(sqlq.MigrateIdleLimit.Seconds())), limit)
	// Quiet past the limit: the server ends the session and its locks with it.
	time.Sleep(sqlq.MigrateIdleLimit + time.Second)
	var n int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances`).Scan(&n)
	require.NoError(t, err, "the instances table is free again")
	_, err = conn.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the stopped script's session was ended")
	conn.Conn().Close(ctx)
	requireVersion(t, pool, schema, latest-1, "nothing of the stopped version was applied")
}

// schemaShape describes what a migration builds in schema, by object, with
// the schema's name written as "S" so that two schemas compare: tables and
// their storage options, columns (by name: a column dropped and added again
// keeps no position), indexes, constraints, triggers, sequences, functions
// (definition and settings: CREATE OR REPLACE resets a function's SET
// clauses) and comments.
func schemaShape(t *testing.T, pool *pgxpool.Pool, schema string) map[string]string {
	t.Helper()
	ctx := context.Background()
	const q = `
SELECT 'rel ' || c.relname, c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '') || ' ' ||
       coalesce(obj_description(c.oid, 'pg_class'), '')
  FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind <> 'i'
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname,
       format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull || ' default=' ||
       coalesce(pg_get_expr(d.adbin, d.adrelid), '') || ' ' || coalesce(col_description(c.oid, a.attnum), '')
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p', 'v') AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index ' || c.relname, pg_get_indexdef(c.oid) || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
  FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'i'
UNION ALL
SELECT 'constraint ' || r.relname || '.' || k.conname, pg_get_constraintdef(k.oid)
  FROM pg_constraint k JOIN pg_class r ON r.oid = k.conrelid WHERE r.relnamespace = $1::regnamespace
UNION ALL
SELECT 'trigger ' || r.relname || '.' || g.tgname, pg_get_triggerdef(g.oid)
  FROM pg_trigger g JOIN pg_class r ON r.oid = g.tgrelid WHERE r.relnamespace = $1::regnamespace AND NOT g.tgisinternal
UNION ALL
SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
       pg_get_functiondef(p.oid) || ' config=' || coalesce(array_to_string(p.proconfig, ','), '') || ' ' ||
       coalesce(obj_description(p.oid, 'pg_proc'), '')
  FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
UNION ALL
SELECT 'schema', coalesce(obj_description($1::regnamespace, 'pg_namespace'), '')`
	rows, err := pool.Query(ctx, q, pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	shape := map[string]string{}
	for rows.Next() {
		var k, v string
		require.NoError(t, rows.Scan(&k, &v))
		shape[k] = strings.ReplaceAll(v, schema, "S")
	}
	require.NoError(t, rows.Err())
	return shape
}

// TestEachDownRestoresThePreviousVersion: down from version N to N-1
// leaves the schema as an install of N-1 builds it — tables, columns,
// indexes, constraints, functions and their settings, comments — for every
// N. A down that forgot a column, an index or a function's SET clause, or
// that restored an older copy of a function than N-1's, differs here.
func TestEachDownRestoresThePreviousVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	up, upSchema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	down, downSchema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true, MaxConns: 2})
	vs := allVersions()
	built := map[int]map[string]string{}
	for _, v := range vs {
		_, err := migrate.UpTo(ctx, up, upSchema, v)
		require.NoError(t, err)
		built[v] = schemaShape(t, up, upSchema)
	}
	_, err := migrate.Up(ctx, down, downSchema)
	require.NoError(t, err)
	require.Equal(t, built[vs[len(vs)-1]], schemaShape(t, down, downSchema), "two installs of the latest version differ")
	for i := len(vs) - 1; i > 0; i-- {
		_, err := migrate.DownTo(ctx, down, downSchema, vs[i-1])
		require.NoError(t, err)
		got := schemaShape(t, down, downSchema)
		want := built[vs[i-1]]
		for k, w := range want {
			if g, ok := got[k]; !ok {
				t.Errorf("down from %d to %d: %s is missing", vs[i], vs[i-1], k)
			} else if g != w {
				t.Errorf("down from %d to %d: %s differs:\n--- installed %d:\n%s\n--- after the down:\n%s", vs[i], vs[i-1], k, vs[i-1], w, g)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("down from %d to %d: %s is left behind", vs[i], vs[i-1], k)
			}
		}
		if t.Failed() {
			return
		}
	}
}

// TestACallersTransactionKeepsItsSettings: migrate in a transaction of the
// caller's (db a pgx.Tx, as To documents) limits each version's idle to
// MigrateIdleLimit and its lock waits to MigrateLockWait — set_config(…,
// true), which a released savepoint keeps for the rest of the caller's
// transaction. The caller's own work after the migration, in the same
// transaction, then ran under a 3 s idle limit: a pause of a few seconds on
// the client (a prompt, a call elsewhere) and the server ended the session,
// the caller's transaction and its migration with it.
func TestACallersTransactionKeepsItsSettings(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, NoMigrate: true})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	show := func() (idle, lock string) {
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('lock_timeout')`).Scan(&idle, &lock))
		return
	}
	idle, lock := show()
	_, err = migrate.Up(ctx, tx, schema)
	require.NoError(t, err)
	idleAfter, lockAfter := show()
	t.Logf("before %s/%s after %s/%s", idle, lock, idleAfter, lockAfter)
	require.Equal(t, idle, idleAfter, "the caller's idle limit after the migration")
	require.Equal(t, lock, lockAfter, "the caller's lock wait after the migration")

	time.Sleep(sqlq.MigrateIdleLimit + time.Second)
	var v string
	require.NoError(t, tx.QueryRow(ctx, `SELECT obj_description(($1 || '.gendurable_instances')::regclass, 'pg_class')`, `"`+schema+`"`).Scan(&v),
		"the caller's transaction outlived a pause of its own after the migration")
	require.NoError(t, tx.Commit(ctx))
}

// TestATableOfYoursNamedLikeGendurablesMayHavePartitions: the version read
// refuses a schema where a table inherits from one of gendurable's, but it
// took every table of the schema named gendurable_… for gendurable's —
// README's scratch section counts "one named gendurable_…" among the
// user's own. A partitioned table of the user's so named (its partitions
// are pg_inherits rows) in gendurable's schema — public by default — made
// Start, every CLI command and migrate refuse the schema (exit 4), telling
// to detach with NO INHERIT, which a partition does not take.
func TestATableOfYoursNamedLikeGendurablesMayHavePartitions(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	s := `"` + schema + `"`
	_, err := pool.Exec(ctx, `CREATE TABLE `+s+`.gendurable_audit (at date NOT NULL, what text) PARTITION BY RANGE (at);
		CREATE TABLE `+s+`.gendurable_audit_2026 PARTITION OF `+s+`.gendurable_audit FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
		CREATE TABLE `+s+`.gendurable_notes (n text);
		CREATE TABLE `+s+`.notes_archive () INHERITS (`+s+`.gendurable_notes)`)
	require.NoError(t, err)
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err, "tables of the user's, named gendurable_…, with children of theirs")
	require.Equal(t, migrate.Latest(), v)

	// gendurable's own tables are still guarded.
	_, err = pool.Exec(ctx, `CREATE TABLE `+s+`.old_signals () INHERITS (`+s+`.gendurable_signals)`)
	require.NoError(t, err)
	_, err = migrate.Installed(ctx, pool, schema)
	require.ErrorIs(t, err, migrate.ErrDependents)
	require.ErrorContains(t, err, "old_signals")
	require.NotContains(t, err.Error(), "gendurable_audit")
}

// stallingDB hands out transactions that go silent, as a migrator that was
// stopped (Ctrl-Z) or cut off from the server, just before the version's
// stamp: after the version's ALTER TABLE, holding the table's exclusive
// lock.
type stallingDB struct {
	migrate.DB
	stall time.Duration
}

func (d stallingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return stallingTx{Tx: tx, stall: d.stall}, nil
}

type stallingTx struct {
	pgx.Tx
	stall time.Duration
}

func (t stallingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if strings.HasPrefix(sql, "COMMENT ON TABLE") {
		select {
		case <-time.After(t.stall):
		case <-ctx.Done():
		}
	}
	return t.Tx.Exec(ctx, sql, args...)
}

// TestAStalledMigratorDoesNotHoldTheWorkersForLong: a migrator that goes
// silent while it holds the instances table's exclusive lock (an upgrade
// probe: its connection cut off after a version's ALTER TABLE) stopped
// every worker's pick, heartbeat, outcome and reap for a minute, the
// idle limit of the library's own transactions: every running step's
// lease was lost and charged. The server ends such a migration within
// sqlq.MigrateIdleLimit, and the statements behind it go through.
func TestAStalledMigratorDoesNotHoldTheWorkersForLong(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 4})
	ctx := context.Background()
	_, err := migrate.To(ctx, pool, schema, alteringVersion-1)
	require.NoError(t, err)

	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	migrated := make(chan error, 1)
	go func() {
		_, err := migrate.UpTo(mctx, stallingDB{DB: pool, stall: sqlq.MigrateIdleLimit + 7*time.Second}, schema, alteringVersion)
		migrated <- err
	}()
	// Wait until the migration holds the table's exclusive lock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var held bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE relation = $1::regclass AND mode = 'AccessExclusiveLock' AND granted)`,
			`"`+schema+`".gendurable_instances`).Scan(&held))
		if held {
			break
		}
		require.True(t, time.Now().Before(deadline), "the migration never took the table's lock")
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	qctx, qcancel := context.WithTimeout(ctx, sqlq.MigrateIdleLimit+5*time.Second)
	defer qcancel()
	var n int
	require.NoError(t, pool.QueryRow(qctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances`).Scan(&n),
		"a worker's statement waited for the silent migrator's lock")
	waited := time.Since(start)
	t.Logf("a statement behind the silent migrator waited %v", waited.Round(time.Millisecond))
	require.Less(t, waited, sqlq.MigrateIdleLimit+2*time.Second)
	require.Error(t, <-migrated, "the silent migration was ended by the server")
	v, err := migrate.Installed(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, alteringVersion-1, v, "nothing of the ended version applied")
	// The next migration completes it.
	_, err = migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
}
