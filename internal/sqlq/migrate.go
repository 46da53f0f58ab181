package sqlq

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/backoff"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one schema version's up and down SQL, still templated.
type Migration struct {
	Version int
	Name    string
	up      string
	down    string
}

// Up renders the version's up SQL for a schema.
func (m Migration) Up(schema string) string { return render(m.up, quoteIdent(schema)) }

// Down renders the version's down SQL for a schema.
func (m Migration) Down(schema string) string { return render(m.down, quoteIdent(schema)) }

// includePrefix starts a line of a migration file that stands for the whole
// of another migration file of this package ("-- include: 011_pick_floor.up.sql"):
// a down migration that puts back what an earlier up migration created
// (version 12's down restores version 11's pick, 13's restores 12's) names that file instead of
// repeating it, so the two cannot drift apart.
const includePrefix = "-- include: "

// expandIncludes replaces each include line of body with the named file.
func expandIncludes(body string) string {
	if !strings.Contains(body, includePrefix) {
		return body
	}
	lines := strings.SplitAfter(body, "\n")
	for i, line := range lines {
		name, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), includePrefix)
		if !ok {
			continue
		}
		inc, err := fs.ReadFile(migrationFS, "migrations/"+name)
		if err != nil || strings.Contains(string(inc), includePrefix) {
			panic("sqlq: bad include in a migration: " + line) // embedded: caught by the tests
		}
		lines[i] = string(inc)
	}
	return strings.Join(lines, "")
}

// Migrations lists every embedded migration in version order (a copy:
// they are read and expanded once).
func Migrations() []Migration { return slices.Clone(migrations()) }

// migrations reads the embedded files once: a migration over several
// versions asks for them at every version.
var migrations = sync.OnceValue(readMigrations)

func readMigrations() []Migration {
	byVersion := map[int]*Migration{}
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		panic(err) // embedded: cannot fail at run time
	}
	for _, e := range entries {
		// 001_init.up.sql
		name := e.Name()
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic("sqlq: bad migration file name " + name)
		}
		raw, err := fs.ReadFile(migrationFS, "migrations/"+name)
		if err != nil {
			panic(err)
		}
		body := expandIncludes(string(raw))
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v}
			byVersion[v] = m
		}
		switch {
		case strings.HasSuffix(rest, ".up.sql"):
			m.Name, m.up = strings.TrimSuffix(rest, ".up.sql"), body
		case strings.HasSuffix(rest, ".down.sql"):
			m.down = body
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// LatestVersion is the highest embedded schema version.
func LatestVersion() int {
	ms := migrations()
	return ms[len(ms)-1].Version
}

const versionCommentPrefix = "gendurable schema version "

// versionComment is the statement that records version v on schema's
// instances table. The comment is a literal: v is an integer we produced.
func versionComment(schema string, v int) string {
	return "COMMENT ON TABLE " + quoteIdent(schema) + ".gendurable_instances IS '" + versionCommentPrefix + strconv.Itoa(v) + "'"
}

// ErrSchemaVersion is the root package's ErrSchemaVersion (and package
// migrate's): a schema at a version this library cannot work with or
// migrate from — newer than it knows, or with a version comment it cannot
// read.
var ErrSchemaVersion = errors.New("gendurable: schema version mismatch")

// ErrSchemaUnknown marks the ErrSchemaVersion errors that migrating up
// cannot mend: a schema newer than this library, or whose version comment is
// missing or unreadable.
var ErrSchemaUnknown = errors.New("the schema's version is not one this library can migrate from")

// RowQuerier runs a single-row query.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// InstalledVersion reads the schema version recorded in the table comment;
// 0 means gendurable is not installed in the schema. A schema where another
// table inherits from one of gendurable's (CREATE TABLE … INHERITS, an
// application's archive) is refused with ErrDependents: PostgreSQL's
// statements on a parent take in its children's rows, so a list, retry,
// cancel, pick or prune would act on rows gendurable did not make (a probe:
// a bulk retry revived an archive's failed row). Start, every CLI command
// and migrate read the version first, so none of them runs on such a
// schema.
func InstalledVersion(ctx context.Context, db RowQuerier, schema string) (int, error) {
	if err := ValidateSchema(schema); err != nil {
		return 0, err
	}
	var comment, heirs *string
	err := db.QueryRow(ctx, installedVersionSQL,
		quoteIdent(schema)+".gendurable_instances", quoteIdent(schema), ownTables()).Scan(&comment, &heirs)
	if err != nil {
		return 0, err
	}
	if comment != nil && heirs != nil {
		return 0, fmt.Errorf("%w: %s: every statement gendurable runs on a table reads and changes the rows of "+
			"the tables that inherit from it too (a list shows them, a retry revives them, a worker runs them, a prune "+
			"deletes them); detach them (ALTER TABLE … NO INHERIT) to use schema %q", ErrDependents, *heirs, schema)
	}
	if comment == nil {
		// to_regclass gives NULL for a missing table; a table without our
		// comment is not ours to touch.
		var exists bool
		if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`,
			quoteIdent(schema)+".gendurable_instances").Scan(&exists); err != nil {
			return 0, err
		}
		if exists {
			return 0, fmt.Errorf("%w (%w): table %s.gendurable_instances exists but carries no gendurable version comment "+
				"(a dump restored with --no-comments loses it): if it is gendurable's, at the version this schema was "+
				"migrated to, restore it with COMMENT ON TABLE %s.gendurable_instances IS '%sN'",
				ErrSchemaVersion, ErrSchemaUnknown, quoteIdent(schema), quoteIdent(schema), versionCommentPrefix)
		}
		return 0, nil
	}
	v, err := strconv.Atoi(strings.TrimPrefix(*comment, versionCommentPrefix))
	if err != nil || !strings.HasPrefix(*comment, versionCommentPrefix) {
		return 0, fmt.Errorf("%w (%w): unrecognised version comment on %s.gendurable_instances: %q (gendurable writes %q)",
			ErrSchemaVersion, ErrSchemaUnknown, quoteIdent(schema), *comment, versionCommentPrefix+"N")
	}
	return v, nil
}

// installedVersionSQL reads the version comment ($1: the instances table)
// and names the tables that inherit from gendurable's ($3, ownTables) in
// schema $2 (NULL if none), in one round trip. Only those: a table of the
// user's named gendurable_… (README counts it among theirs) may have
// children, or partitions, of its own.
const installedVersionSQL = `SELECT obj_description(to_regclass($1), 'pg_class'),
  (SELECT string_agg(format('table %s inherits from %s', ih.inhrelid::regclass, ih.inhparent::regclass), '; '
                     ORDER BY ih.inhrelid::regclass::text)
   FROM pg_inherits AS ih JOIN pg_class AS p ON p.oid = ih.inhparent
   WHERE p.relnamespace = to_regnamespace($2) AND p.relkind = 'r' AND p.relname = ANY ($3::text[]))`

// ownTables names the tables gendurable's migrations create, whatever the
// version (a table a later version drops has no rows to take in).
var ownTables = sync.OnceValue(func() []string {
	var names []string
	for _, m := range migrations() {
		for _, g := range createTable.FindAllStringSubmatch(sqlComment.ReplaceAllString(m.up, ""), -1) {
			if !slices.Contains(names, g[1]) {
				names = append(names, g[1])
			}
		}
	}
	return names
})

// Beginner opens transactions (a pool or a connection).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// migrateLock serializes migrators of one schema, and limits the
// migration's idle to MigrateIdleLimit: a migrator cut off mid-migration
// must not hold the schema's locks for long.
var migrateLock = `SELECT ` + idleLimitAtMost(MigrateIdleLimit.Milliseconds()) +
	`, pg_advisory_xact_lock(hashtext('gendurable.migrate.' || $1))`

// callersSettings reads, and restoreCallersSettings sets back, the limits a
// version sets for its transaction, in a caller's transaction (migrate1).
const (
	callersSettings        = `SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('lock_timeout')`
	restoreCallersSettings = `SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('lock_timeout', $2, true)`
)

// MigrateIdleLimit is how long the server lets a migration's transaction
// wait on its client (idle_in_transaction_session_timeout). A version that
// alters the instances table holds its exclusive lock until it commits, and
// every worker's pick, heartbeat, outcome and reap waits behind it: a
// migrator stopped or cut off there (an upgrade probe: its connection cut
// after version 24's ALTER TABLE) held them for a minute, the limit of the
// library's own transactions, and every running step lost its lease and
// was charged. A migration sends its statements back to back, so a few
// seconds is ample.
const MigrateIdleLimit = 3 * time.Second

// MigrateLockWait bounds each lock wait of a migration's statements. A
// migration's ALTER TABLE needs the table's exclusive lock, and a lock
// request that waits queues every later statement on the table behind it:
// a migration waiting behind another transaction (a long report, a
// caller's open InsertTx, pg_dump) would stop every worker's picks,
// heartbeats and outcomes for as long (a probe's own program: 24 s of no step, and the
// leases of every running step lost). So a migration waits at most this
// long for each lock, then rolls back, lets the queued statements through,
// and tries again (Migrate): unblocked, a migration takes its locks within
// milliseconds, as the workers' statements are short.
const MigrateLockWait = 500 * time.Millisecond

// migrateLockWait is the set_config of MigrateLockWait, keeping a stricter
// lock_timeout of the session's.
var migrateLockWait = `SELECT ` + settingAtMost("lock_timeout", strconv.FormatInt(MigrateLockWait.Milliseconds(), 10))

// stampLockWait sets the lock wait of a version's stamp (its COMMENT ON
// TABLE) to the server's deadlock_timeout plus MigrateLockWait, whatever
// the session's lock_timeout. The stamp needs SHARE UPDATE EXCLUSIVE on the
// instances table, which no worker statement conflicts with (a request
// that waits for it holds none of them up), but an autovacuum of the table
// holds; and PostgreSQL cancels an autovacuum that blocks a lock request
// only once the request has waited deadlock_timeout — a lock_timeout no
// longer than that ends the wait first. Waiting MigrateLockWait, a version
// whose stamp is its only contended lock never got the autovacuum
// cancelled, and waited for it to end (a probe: 45 s on a table whose
// vacuum ran slowly; a review: the same with a role's lock_timeout of 1 s,
// kept as "stricter").
var stampLockWait = `SELECT set_config('lock_timeout',
  ((extract(epoch FROM current_setting('deadlock_timeout')::interval) * 1000)::bigint + ` +
	strconv.FormatInt(MigrateLockWait.Milliseconds(), 10) + `)::text, true)`

// Migrate moves the schema from its installed version to target, up or down,
// one version per transaction, each serialized by an advisory lock, so
// concurrent migrators (several processes starting at once) apply each
// version exactly once. A version's transaction commits its SQL with the
// version comment: an upgrade over several versions holds each version's
// table locks only while that version runs (not an ALTER's exclusive lock
// through every later version's index builds), and one interrupted keeps
// the versions it committed. It returns the versions applied, in order —
// with an error too, those committed before it. Each of its statements
// waits at most MigrateLockWait for a lock another transaction holds (but
// a version's stamp: stampLockWait); the
// version's transaction is then rolled back and tried again, after a pause
// (1 s, doubling up to 30 s, jittered), until ctx ends — so the workers'
// statements that queue behind the migration's lock request wait at most
// MigrateLockWait at a time, and a small share of the time while the
// blocker lasts (TestMigrationBehindABlockerDoesNotStallTheWorkers). A
// deadlock with another transaction (SQLSTATE 40P01) is tried again the
// same way.
func Migrate(ctx context.Context, db Beginner, schema string, target int) (from int, applied []int, err error) {
	from, _, applied, err = MigrateDir(ctx, db, schema, target, 0)
	return from, applied, err
}

// ErrMigrateDirection: a migration asked to move only up (or only down)
// found the installed version past its target, read under the migration's
// lock — another migrator moved the schema meanwhile. Nothing was applied.
// Or, after it applied some versions, another migrator moved the schema
// back the other way: it stopped there.
var ErrMigrateDirection = errors.New("the installed version is on the other side of the target")

// MigrateDir is Migrate moving only up (dir > 0: refused, with
// ErrMigrateDirection, when the installed version is above target) or only
// down (dir < 0: refused when below target); dir 0 moves either way. The
// direction is checked against the version read under the migration's
// advisory lock, so a check made before it (a confirmation asked of an
// operator) cannot be overtaken by a concurrent migrator. Once a version
// is applied the migration keeps its direction: another migrator going
// the same way may apply versions between its own (it goes on from theirs,
// and stops without error should they pass its target), but one that
// moved the schema back stops it with ErrMigrateDirection — an up and a
// down at once would otherwise undo each other's versions, over and over.
// It returns the version read first, the version installed at its end
// (the last one it read or committed), and the versions it applied.
func MigrateDir(ctx context.Context, db Beginner, schema string, target, dir int) (from, to int, applied []int, err error) {
	if err := ValidateSchema(schema); err != nil {
		return 0, 0, nil, err
	}
	latest := LatestVersion()
	if target < 0 || target > latest {
		return 0, 0, nil, fmt.Errorf("target version %d out of range 0..%d", target, latest)
	}
	expect := -1 // the version this migrator left: none yet
	for {
		at, step, now, err := migrateStep(ctx, db, schema, target, dir, expect)
		at = max(at, 0) // -1: the first step failed before it read the version
		if expect < 0 {
			from, to = at, at
			if dir == 0 && at != target {
				dir = 1
				if at > target {
					dir = -1
				}
			}
		}
		if err != nil {
			if errors.Is(err, ErrMigrateDirection) {
				// Another migrator moved the schema since this one's last
				// step: it is at the version this step read (a probe: an
				// up and a down at once, the loser saying "stopped at 14"
				// and "moved to version 13" in one message).
				to = at
			}
			return from, to, applied, err
		}
		to = at
		if step == 0 {
			return from, to, applied, nil
		}
		applied, to, expect = append(applied, step), now, now
	}
}

// migrateStep applies the next version from the installed one toward
// target (MigrateDir), trying again after a lock wait, a deadlock or a
// catalog entry dropped under it by another transaction (CatalogRace). It
// returns the version it read, the one it applied (0: none was left) and
// the version installed once it was.
//
// In a caller's transaction (db a pgx.Tx: each version a savepoint) it
// does not try again: rolling back to the savepoint keeps the locks the
// caller's transaction took before, so whatever waits on them waits on,
// and what this version waited for may be waiting for them — two demos
// started together (each locks its schema's tables, then drops them inside
// one transaction) each waited for the other, one tried again every
// second, and neither ended. The error goes back to the caller, whose
// rollback frees its locks.
func migrateStep(ctx context.Context, db Beginner, schema string, target, dir, expect int) (at, applied, now int, err error) {
	_, callersTx := db.(pgx.Tx)
	for tries := 1; ; tries++ {
		at, applied, now, err = migrate1(ctx, db, schema, target, dir, expect)
		if err == nil || !LockTimedOut(err) && !Deadlocked(err) && !CatalogRace(err) {
			return at, applied, now, err
		}
		if callersTx && CatalogRace(err) {
			return at, 0, at, err // the caller's own retry decides (scratch's drop tries again)
		}
		if callersTx {
			return at, 0, at, fmt.Errorf("another transaction held a lock on the schema's tables (or deadlocked with this one), "+
				"and in the caller's transaction the version is not tried again: %w", err)
		}
		wait := backoff.Delay(time.Second, 30*time.Second, tries)
		select {
		case <-ctx.Done():
			return at, 0, at, fmt.Errorf("another transaction held a lock on the schema's tables (or deadlocked with it) through %d tries "+
				"(each waited at most %s for it, so the workers' statements were not held up for longer; a version's stamp, "+
				"which holds no worker up, deadlock_timeout + %s): %w: %w",
				tries, MigrateLockWait, MigrateLockWait, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// migrate1 is one try of one version of Migrate: one transaction. expect
// is the version this migrator's last step left (-1 before its first).
func migrate1(ctx context.Context, db Beginner, schema string, target, dir, expect int) (from, applied, now int, err error) {
	latest := LatestVersion()
	tx, err := db.Begin(ctx)
	if err != nil {
		return expect, 0, expect, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// In a caller's transaction (db a pgx.Tx: tx a savepoint) the limits
	// below are the version's, not the caller's: set_config(…, true) in a
	// released savepoint holds to the end of the caller's transaction, whose
	// own work after the migration then ran under MigrateIdleLimit (3 s
	// idle, and the session was ended) and the stamp's lock wait. They are
	// set back before the savepoint is released (a rollback to it does so
	// itself).
	var callersIdle, callersLock string
	_, callersTx := db.(pgx.Tx)
	if callersTx {
		if err := tx.QueryRow(ctx, callersSettings).Scan(&callersIdle, &callersLock); err != nil {
			return expect, 0, expect, err
		}
	}
	if _, err := tx.Exec(ctx, migrateLock, schema); err != nil {
		return expect, 0, expect, err
	}
	// After the advisory lock: another migrator of the schema is waited
	// for as long as it takes (it holds up no worker while it waits).
	if _, err := tx.Exec(ctx, migrateLockWait); err != nil {
		return expect, 0, expect, err
	}
	if target > 0 {
		// Down (target 0) creates nothing: a missing schema has no tables
		// to remove, and InstalledVersion reads it as version 0. An
		// existing schema is not created again: PostgreSQL checks the
		// database's CREATE privilege before IF NOT EXISTS, and a role that
		// owns its schema but may not create schemas could never migrate.
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
			return expect, 0, expect, err
		}
		if !exists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+quoteIdent(schema)); err != nil {
				return expect, 0, expect, err
			}
		}
	}
	from, err = InstalledVersion(ctx, tx, schema)
	if err != nil {
		return expect, 0, expect, err
	}
	if from > latest {
		return from, 0, from, fmt.Errorf("%w (%w): schema %q is at version %d, newer than this library's %d: "+
			"upgrade this process's gendurable (a newer process migrated it)", ErrSchemaVersion, ErrSchemaUnknown, schema, from, latest)
	}
	way := wayOf(dir)
	if expect >= 0 && from != expect && (dir > 0) != (from > expect) {
		// Moved back the other way since this migrator's last version.
		return from, 0, from, fmt.Errorf("%w: schema %q was moved to version %d by another migrator after this one left it at %d; "+
			"moving only %s to %d, it stopped there", ErrMigrateDirection, schema, from, expect, way, target)
	}
	if dir > 0 && from > target || dir < 0 && from < target {
		if expect >= 0 {
			// Another migrator moved the schema on past the target, the
			// way this migration was going.
			return from, 0, from, nil
		}
		return from, 0, from, fmt.Errorf("%w: schema %q is at version %d; moving only %s to %d, nothing was applied",
			ErrMigrateDirection, schema, from, way, target)
	}
	if from == target {
		return from, 0, from, nil
	}
	ms := migrations()
	var m Migration
	var sql string
	if target > from {
		for _, c := range ms {
			if c.Version > from {
				m, sql, now = c, c.Up(schema), c.Version
				break
			}
		}
	} else {
		for i := len(ms) - 1; i >= 0; i-- {
			if ms[i].Version <= from {
				m, sql, now = ms[i], ms[i].Down(schema), 0
				if i > 0 {
					now = ms[i-1].Version
				}
				break
			}
		}
	}
	step := wayOf(target - from) // dir may be 0: either way
	// Drop only gendurable's own indexes: an index of the name on a table of
	// the user's is theirs (see checkIndexNames).
	if err := checkIndexNames(ctx, tx, schema, m.Version, step, indexNames(dropIndex, sql), false); err != nil {
		return from, 0, from, err
	}
	// Going up, a column a version adds "if not exists" must not be there
	// yet (see checkColumnNames); going down, nothing elsewhere may hang on
	// a table it drops (checkDependents).
	if target > from {
		if err := checkTableNames(ctx, tx, schema, ms, from, target); err != nil {
			return from, 0, from, err
		}
		if err := checkColumnNames(ctx, tx, schema, m.Version, sql); err != nil {
			return from, 0, from, err
		}
	} else {
		// Every table the versions down to target drop, checked at each
		// version: a down to 0 is refused before its first version, not
		// at version 1 with the others committed.
		var rest, trial strings.Builder
		for _, c := range ms {
			if c.Version > target && c.Version <= from {
				rest.WriteString(c.Down(schema) + "\n")
			}
		}
		for i := len(ms) - 1; i >= 0; i-- { // newest first, as they run
			if ms[i].Version > target && ms[i].Version <= from {
				trial.WriteString(ms[i].Down(schema) + ";\n")
			}
		}
		if err := checkDependents(ctx, tx, schema, m.Version, rest.String()); err != nil {
			return from, 0, from, err
		}
		if err := trialDown(ctx, tx, m.Version, trial.String()); err != nil {
			return from, 0, from, err
		}
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		return from, 0, from, fmt.Errorf("migration %d %s: %w", m.Version, step, err)
	}
	// What a build "if not exists" skipped must be gendurable's own index,
	// and going up, a valid one.
	if err := checkIndexNames(ctx, tx, schema, m.Version, step, indexNames(ifNotExistsIndex, sql), target > from); err != nil {
		return from, 0, from, err
	}
	if now > 0 {
		if _, err := tx.Exec(ctx, stampLockWait); err != nil {
			return from, 0, from, err
		}
		if _, err := tx.Exec(ctx, versionComment(schema, now)); err != nil {
			return from, 0, from, err
		}
	}
	if callersTx {
		if _, err := tx.Exec(ctx, restoreCallersSettings, callersIdle, callersLock); err != nil {
			return from, 0, from, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return from, 0, from, err
	}
	return from, m.Version, now, nil
}

// createdRelation finds the tables and sequences a version's up creates
// (in its raw text, before the schema is put in).
var createdRelation = regexp.MustCompile(`(?i)CREATE\s+(?:TABLE|SEQUENCE)\s+(?:IF\s+NOT\s+EXISTS\s+)?\{\{schema\}\}\.(\w+)`)

// checkTableNames fails an up, before its first version, when a table or
// sequence one of the versions from+1..target creates is already in the
// schema: it is not gendurable's (no version drops one going up), and the
// version that creates it would stop on its name after the versions before
// it had committed (a probe: a schema holding an application's
// gendurable_queues was left at version 2). Nothing is applied.
func checkTableNames(ctx context.Context, tx pgx.Tx, schema string, ms []Migration, from, target int) error {
	names, creator := createdTables(ms, from, target)
	if len(names) == 0 {
		return nil
	}
	var taken *string
	if err := tx.QueryRow(ctx, takenTablesSQL, quoteIdent(schema), names).Scan(&taken); err != nil {
		return err
	}
	if taken == nil {
		return nil
	}
	return errors.New(takenTableMsg(schema, *taken, creator[*taken]))
}

// takenTablesSQL is the first ($1 the quoted schema) of the names $2 taken
// by a relation in the schema, or NULL.
const takenTablesSQL = `SELECT min(c.relname) FROM pg_class AS c
		WHERE c.relnamespace = to_regnamespace($1) AND c.relname = ANY($2::text[])`

// createdTables are the tables and sequences the ups of versions
// from+1..target create, with the version that creates each.
func createdTables(ms []Migration, from, target int) ([]string, map[string]int) {
	var names []string
	creator := map[string]int{}
	for _, m := range ms {
		if m.Version <= from || m.Version > target {
			continue
		}
		for _, g := range createdRelation.FindAllStringSubmatch(sqlComment.ReplaceAllString(m.up, ""), -1) {
			names = append(names, g[1])
			creator[g[1]] = m.Version
		}
	}
	return names, creator
}

// takenTableMsg is checkTableNames' refusal of name, which version creates.
func takenTableMsg(schema, name string, version int) string {
	return fmt.Sprintf("migration %d up: %s in schema %q exists already, and not from gendurable (version %d creates it): "+
		"rename or move yours, then migrate again; nothing was applied", version, name, schema, version)
}

// scriptTableGuard is checkTableNames as a printed script's guard, run in
// its first version's transaction: the same query, the same message.
func scriptTableGuard(schema string, ms []Migration, from, to int) string {
	names, creator := createdTables(ms, from, to)
	if len(names) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("-- No table or sequence a version below creates is in the schema already (migrate checks this too).\n" +
		"DO $gendurable$\nDECLARE taken text;\nBEGIN\n")
	// The names are literals of the migrations' own identifiers (\w+).
	fmt.Fprintf(&b, "  %s INTO taken;\n", strings.NewReplacer("$1", quoteLiteral(quoteIdent(schema)), "$2::text[]", textArray(names),
		"SELECT min(c.relname)", "SELECT min(c.relname)::text", "\n\t\t", "\n    ").Replace(takenTablesSQL))
	for _, n := range names {
		fmt.Fprintf(&b, "  IF taken = %s THEN\n    RAISE EXCEPTION USING MESSAGE = %s;\n  END IF;\n",
			quoteLiteral(n), quoteLiteral(takenTableMsg(schema, n, creator[n])))
	}
	b.WriteString("END $gendurable$;\n")
	return b.String()
}

// wayOf names the direction d (its sign) moves the schema.
func wayOf(d int) string {
	if d < 0 {
		return "down"
	}
	return "up"
}

// ifNotExistsIndex finds the indexes a migration builds only if missing
// (an operator may build them CONCURRENTLY by hand first).
var ifNotExistsIndex = regexp.MustCompile(`(?i)CREATE\s+(?:UNIQUE\s+)?INDEX\s+IF\s+NOT\s+EXISTS\s+(\w+)`)

// dropIndex finds the indexes a migration drops.
var dropIndex = regexp.MustCompile(`(?i)DROP\s+INDEX\s+(?:IF\s+EXISTS\s+)?(?:\S+?\.)?(\w+)`)

// sqlComment is a line comment of a migration's SQL (its prose may name
// statements).
var sqlComment = regexp.MustCompile(`--[^\n]*`)

// indexNames are the index names re (dropIndex, ifNotExistsIndex) finds
// in sql, comments left out.
func indexNames(re *regexp.Regexp, sql string) []string {
	var names []string
	for _, g := range re.FindAllStringSubmatch(sqlComment.ReplaceAllString(sql, ""), -1) {
		names = append(names, g[1])
	}
	return names
}

// checkIndexNames fails a version when one of the index names it builds
// only if missing (checked after its statements) or drops (checked before
// them) is taken in the schema by something that is not an index of
// gendurable's tables: an index on a table of the user's, or another kind
// of relation (relation names share one namespace per schema). A build "if
// not exists" would skip gendurable's index without a word — the picks
// would then scan the table — and a drop would drop the user's index. A
// hostile-operator probe did both with an index named
// gendurable_instances_unique_key on a table of its own; a review found
// the names versions 5 and 6 free going up, and build again going down,
// open to the same, and a view of such a name skipping a build.
//
// With valid, it also fails a version whose index of such a name is not
// valid: what a CREATE INDEX CONCURRENTLY by hand leaves when it fails or
// is cancelled (or while it still runs). IF NOT EXISTS would keep it, and
// no statement would ever use it. One statement reads both.
func checkIndexNames(ctx context.Context, tx pgx.Tx, schema string, version int, way string, names []string, valid bool) error {
	if len(names) == 0 {
		return nil
	}
	var foreign, invalid *string
	if err := tx.QueryRow(ctx, indexNamesSQL, schema, names, valid).Scan(&foreign, &invalid); err != nil {
		return err
	}
	switch {
	case foreign != nil:
		return errors.New(foreignIndexMsg(schema, version, way, *foreign))
	case invalid != nil:
		return errors.New(invalidIndexMsg(schema, version, way, *invalid))
	}
	return nil
}

// indexNamesSQL reads, for checkIndexNames and the scripts' guards, the
// names among $2 that schema $1 holds and that are not gendurable's
// indexes, and (with $3) those that are but are not valid.
const indexNamesSQL = `SELECT
		  string_agg(format('%s (%s)', x.relname, CASE WHEN x.is_index THEN 'an index on ' || coalesce(x.tab, '?') ELSE 'not an index' END),
		             ', ' ORDER BY x.relname) FILTER (WHERE x.not_ours),
		  string_agg(x.relname, ', ' ORDER BY x.relname) FILTER (WHERE $3 AND NOT x.not_ours AND NOT x.ready)
		FROM (SELECT c.relname, c.relkind IN ('i', 'I') AS is_index, t.relname AS tab,
		             c.relkind NOT IN ('i', 'I') OR t.relname IS NULL OR t.relname NOT LIKE 'gendurable\_%' AS not_ours,
		             coalesce(i.indisvalid AND i.indisready, false) AS ready
		      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		      LEFT JOIN pg_index i ON i.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = i.indrelid
		      WHERE n.nspname = $1 AND c.relname = ANY($2)) AS x`

func foreignIndexMsg(schema string, version int, way, foreign string) string {
	return fmt.Sprintf("migration %d %s: %s in schema %q: gendurable needs that name for an index of its own "+
		"(rename yours, e.g. ALTER INDEX … RENAME TO, then migrate again); nothing of version %d was applied",
		version, way, foreign, schema, version)
}

func invalidIndexMsg(schema string, version int, way, invalid string) string {
	return fmt.Sprintf("migration %d %s: index %s in schema %q is not valid (a CREATE INDEX CONCURRENTLY that failed "+
		"or was cancelled leaves it so, and one still building is too): DROP INDEX it (or let the build finish), "+
		"then migrate again; nothing of version %d was applied", version, way, invalid, schema, version)
}

// addColumnIfNotExists finds the columns a migration adds only if missing,
// with their table (a version's down runs an older up again, on a table
// that has them: 021's down runs 018's up).
var addColumnIfNotExists = regexp.MustCompile(`(?i)ALTER\s+TABLE\s+(?:\S+?\.)?(\w+)\s+ADD\s+COLUMN\s+IF\s+NOT\s+EXISTS\s+(\w+)`)

// checkColumnNames fails a version going up when a column it adds "if not
// exists" is already there: going up, no earlier version made it, so it is
// a column of the user's (or of something else's). ADD COLUMN IF NOT EXISTS
// would have taken it over as gendurable's own — a hostile-operator probe
// added inbox_seen as text and unstarted_token with a default at version
// 16: the upgrade said version 22 while every pick failed on the column's
// type, and a later down to 16 dropped both columns with their data.
func checkColumnNames(ctx context.Context, tx pgx.Tx, schema string, version int, sql string) error {
	tables, columns := addedColumns(sql)
	if len(columns) == 0 {
		return nil
	}
	var taken *string
	if err := tx.QueryRow(ctx, columnNamesSQL, schema, tables, columns).Scan(&taken); err != nil {
		return err
	}
	if taken != nil {
		return errors.New(takenColumnMsg(schema, version, *taken))
	}
	return nil
}

// addedColumns are the columns sql adds "if not exists", with their tables.
func addedColumns(sql string) (tables, columns []string) {
	for _, g := range addColumnIfNotExists.FindAllStringSubmatch(sqlComment.ReplaceAllString(sql, ""), -1) {
		tables, columns = append(tables, g[1]), append(columns, g[2])
	}
	return tables, columns
}

// columnNamesSQL reads, for checkColumnNames and the scripts' guards, the
// columns among ($2, $3) (table, column) that tables of schema $1 have.
const columnNamesSQL = `SELECT string_agg(format('%s.%s', c.relname, a.attname), ', ' ORDER BY c.relname, a.attname)
		FROM unnest($2::text[], $3::text[]) AS x(tab, col)
		JOIN pg_namespace n ON n.nspname = $1
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = x.tab
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = x.col AND NOT a.attisdropped`

func takenColumnMsg(schema string, version int, taken string) string {
	return fmt.Sprintf("migration %d up: column %s in schema %q exists already, and not from gendurable "+
		"(version %d adds it): rename yours (ALTER TABLE … RENAME COLUMN), then migrate again; nothing of version %d was applied",
		version, taken, schema, version, version)
}

// ErrDependents: a version going down would drop a table or a column that
// an object outside the schema depends on (checkDependents).
var ErrDependents = errors.New("objects that are not gendurable's depend on its tables")

// dropTable finds the tables a migration drops; alterTable and dropColumn
// the columns it drops, statement by statement.
var (
	dropTable  = regexp.MustCompile(`(?i)DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:\S+?\.)?(\w+)`)
	alterTable = regexp.MustCompile(`(?i)ALTER\s+TABLE\s+(?:\S+?\.)?(\w+)`)
	dropColumn = regexp.MustCompile(`(?i)DROP\s+COLUMN\s+(?:IF\s+EXISTS\s+)?(\w+)`)
)

// checkDependents fails a version going down when an object outside the
// schema depends automatically on a table or a column sql drops (the caller
// passes the downs of every version left to go): DROP TABLE … RESTRICT
// refuses what depends on a table normally (a view, a foreign key), but
// drops what depends on it automatically without a word — a constraint
// trigger on a table of the user's declared FROM gendurable_instances (a
// hostile-operator probe: demo and migrate down to 0 dropped it),
// statistics elsewhere on it or on a column a version drops (a review), the
// table's membership of a publication. What hangs on gendurable's own
// tables — a trigger, a policy or a rule on them, which have no schema of
// their own but their table's, an index of the schema — is inside, and
// goes with them; but not a column someone added to a table a down drops:
// DROP TABLE takes it with its data (a probe: down to 0 dropped a user's
// tenant column without a word), so it is refused too.
func checkDependents(ctx context.Context, tx pgx.Tx, schema string, version int, sql string) error {
	tables, columns := droppedColumns(sql)
	if len(tables) == 0 {
		return nil
	}
	var deps *string
	ownTables, ownColumns := gendurableColumns()
	if err := tx.QueryRow(ctx, dependentsSQL, schema, tables, columns, ownTables, ownColumns).Scan(&deps); err != nil {
		return err
	}
	if deps != nil {
		return fmt.Errorf("migration %d down: %w: %s", version, ErrDependents, dependentsAdvice(version, *deps))
	}
	return nil
}

// createTable and addColumn find the columns gendurable's up migrations
// create: each line of a CREATE TABLE's body that begins with a name (not
// a constraint), and each ADD COLUMN.
var (
	createTable = regexp.MustCompile(`(?is)CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(?:\S+?\.)?(\w+)\s*\((.*?)\n\);`)
	columnLine  = regexp.MustCompile(`(?m)^\s+(\w+)\s+\S`)
	addColumn   = regexp.MustCompile(`(?i)ADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)`)
)

// gendurableColumns are the columns gendurable's migrations create, as
// pairs (tables[i], columns[i]): of every version, a superset of any one's.
var gendurableColumns = sync.OnceValues(func() (tables, columns []string) {
	for _, m := range migrations() {
		sql := sqlComment.ReplaceAllString(m.up, "")
		for _, g := range createTable.FindAllStringSubmatch(sql, -1) {
			for _, c := range columnLine.FindAllStringSubmatch(g[2], -1) {
				switch strings.ToUpper(c[1]) {
				case "CONSTRAINT", "PRIMARY", "UNIQUE", "CHECK", "FOREIGN", "EXCLUDE":
					continue
				}
				tables, columns = append(tables, g[1]), append(columns, c[1])
			}
		}
		t, c := alteredColumns(sql, addColumn)
		tables, columns = append(tables, t...), append(columns, c...)
	}
	return tables, columns
})

// alteredColumns are the columns that the ALTER TABLE statements of sql
// name in clauses that column (ADD COLUMN, DROP COLUMN) matches, with their
// tables.
func alteredColumns(sql string, column *regexp.Regexp) (tables, columns []string) {
	for _, stmt := range strings.Split(sql, ";") {
		t := alterTable.FindStringSubmatch(stmt)
		if t == nil {
			continue
		}
		for _, g := range column.FindAllStringSubmatch(stmt, -1) {
			tables, columns = append(tables, t[1]), append(columns, g[1])
		}
	}
	return tables, columns
}

// droppedColumns are the tables sql drops (column "") and the columns it
// drops, with their tables.
func droppedColumns(sql string) (tables, columns []string) {
	sql = sqlComment.ReplaceAllString(sql, "")
	for _, g := range dropTable.FindAllStringSubmatch(sql, -1) {
		tables, columns = append(tables, g[1]), append(columns, "")
	}
	t, c := alteredColumns(sql, dropColumn)
	return append(tables, t...), append(columns, c...)
}

// dependentsAdvice is what checkDependents says after the objects deps.
func dependentsAdvice(version int, deps string) string {
	return fmt.Sprintf("%s; the down would drop these with its tables or columns, or fail on them part way: "+
		"remove them yourself (or move them off gendurable's tables), then migrate again; nothing of version %d was applied",
		deps, version)
}

// dependentsSQL reads, for checkDependents and the scripts' guards, the
// objects outside schema $1 that hang on the tables and columns ($2, $3;
// column "" for a whole table) the downs drop, and the columns of those
// tables that are not among gendurable's ($4, $5: gendurableColumns).
const dependentsSQL = `WITH gone AS (
		  -- The tables and columns the downs drop, with the name to give each.
		  SELECT n.oid AS ns, n.nspname, c.oid AS rel, c.relname, u.col, a.attnum,
		         c.relname || CASE WHEN u.col <> '' THEN '.' || u.col ELSE '' END AS label
		  FROM unnest($2::text[], $3::text[]) AS u(tab, col)
		  JOIN pg_namespace n ON n.nspname = $1
		  JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = u.tab
		  LEFT JOIN pg_attribute a ON u.col <> '' AND a.attrelid = c.oid AND a.attname = u.col AND NOT a.attisdropped
		)
		SELECT string_agg(DISTINCT format('%s %s (on %s)', x.type, x.identity, x.label), ', '
		                  ORDER BY format('%s %s (on %s)', x.type, x.identity, x.label)) FROM (
		  SELECT o.type, o.identity, g.label
		  FROM gone AS g
		  JOIN pg_depend d ON d.refclassid = 'pg_class'::regclass AND d.refobjid = g.rel AND d.deptype = 'a'
		    AND (g.col = '' OR d.refobjsubid = g.attnum)
		  CROSS JOIN LATERAL pg_identify_object(d.classid, d.objid, d.objsubid) AS o
		  -- The schema of the table an object without one of its own is on.
		  CROSS JOIN LATERAL (SELECT CASE d.classid
		      WHEN 'pg_trigger'::regclass THEN (SELECT r.relnamespace FROM pg_trigger AS t JOIN pg_class AS r ON r.oid = t.tgrelid WHERE t.oid = d.objid)
		      WHEN 'pg_policy'::regclass THEN (SELECT r.relnamespace FROM pg_policy AS p JOIN pg_class AS r ON r.oid = p.polrelid WHERE p.oid = d.objid)
		      WHEN 'pg_rewrite'::regclass THEN (SELECT r.relnamespace FROM pg_rewrite AS w JOIN pg_class AS r ON r.oid = w.ev_class WHERE w.oid = d.objid)
		      WHEN 'pg_attrdef'::regclass THEN (SELECT r.relnamespace FROM pg_attrdef AS ad JOIN pg_class AS r ON r.oid = ad.adrelid WHERE ad.oid = d.objid)
		    END AS ns) AS own
		  -- pg_identify_object quotes the schema's name as an identifier
		  -- ("MyApp"): a schema of capitals listed gendurable's own indexes.
		  WHERE NOT CASE WHEN own.ns IS NOT NULL THEN own.ns = g.ns
		                 ELSE coalesce(o.schema IN (g.nspname, quote_ident(g.nspname)), false) END
		  UNION ALL
		  -- What depends on them normally and is not on one of gendurable's
		  -- tables — a view, a foreign key of another table — makes DROP
		  -- TABLE or DROP COLUMN … RESTRICT fail: at version 1 of a down to
		  -- 0, the versions above it committed (a hostile-operator probe; a
		  -- view on the instances table left the schema at version 1).
		  SELECT o.type, o.identity, g.label
		  FROM gone AS g
		  JOIN pg_depend d ON d.refclassid = 'pg_class'::regclass AND d.refobjid = g.rel AND d.deptype = 'n'
		    AND d.classid IN ('pg_rewrite'::regclass, 'pg_constraint'::regclass)
		    AND (g.col = '' OR d.refobjsubid = g.attnum)
		  -- A view's rule is named as the view; on_rel is the table the
		  -- view or the constraint belongs to.
		  CROSS JOIN LATERAL (SELECT CASE d.classid
		      WHEN 'pg_rewrite'::regclass THEN (SELECT w.ev_class FROM pg_rewrite AS w WHERE w.oid = d.objid)
		      WHEN 'pg_constraint'::regclass THEN (SELECT k.conrelid FROM pg_constraint AS k WHERE k.oid = d.objid)
		    END AS rel) AS on_rel
		  CROSS JOIN LATERAL pg_identify_object(
		      CASE WHEN d.classid = 'pg_rewrite'::regclass THEN 'pg_class'::regclass ELSE d.classid END,
		      CASE WHEN d.classid = 'pg_rewrite'::regclass THEN on_rel.rel ELSE d.objid END,
		      0) AS o
		  WHERE NOT EXISTS (SELECT 1 FROM pg_class AS r
		                    WHERE r.oid = on_rel.rel AND r.relnamespace = g.ns AND r.relname LIKE 'gendurable\_%')
		  UNION ALL
		  -- A table that inherits from one the downs change (INHERITS,
		  -- wherever it is: gendurable makes none): ALTER TABLE … DROP COLUMN
		  -- recurses into it, and drops the column it inherited with that
		  -- column's data, without a word and without RESTRICT stopping it (a
		  -- probe: migrate down --to 23 dropped unconfirmed_freed from a table
		  -- of another schema declared INHERITS gendurable_instances).
		  SELECT o.type, o.identity, g.label
		  FROM gone AS g
		  JOIN pg_inherits AS ih ON ih.inhparent = g.rel
		  CROSS JOIN LATERAL pg_identify_object('pg_class'::regclass, ih.inhrelid, 0) AS o
		  UNION ALL
		  -- A column someone added to a table the downs drop: it goes with
		  -- the table, and its data with it.
		  SELECT o.type, o.identity, g.label
		  FROM gone AS g
		  JOIN pg_attribute AS a ON g.col = '' AND a.attrelid = g.rel AND a.attnum > 0 AND NOT a.attisdropped
		  CROSS JOIN LATERAL pg_identify_object('pg_class'::regclass, g.rel, a.attnum) AS o
		  WHERE NOT EXISTS (SELECT 1 FROM unnest($4::text[], $5::text[]) AS k(tab, col)
		                    WHERE k.tab = g.relname AND k.col = a.attname)) AS x`

// trialDown runs every down left to go (sql, newest first) in a savepoint
// and rolls it back: what the server would refuse part way — a DROP TABLE
// or DROP COLUMN … RESTRICT that something depends on (SQLSTATE 2BP01) —
// is refused before the first version, nothing applied, whatever the
// dependent object is (checkDependents names the usual ones; a review
// found a function with a SQL-standard body, a column of a table's row
// type, a policy on another table, a view named like gendurable's own,
// each leaving a down to 0 at version 1, the versions above it committed).
// The trial takes the locks the downs take, a little earlier; they are
// the transaction's until it ends.
func trialDown(ctx context.Context, tx pgx.Tx, version int, sql string) error {
	if _, err := tx.Exec(ctx, "SAVEPOINT gendurable_down_trial"); err != nil {
		return err
	}
	_, trialErr := tx.Exec(ctx, sql)
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT gendurable_down_trial"); err != nil {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(trialErr, &pgErr) && pgErr.Code == "2BP01" {
		what := pgErr.Message
		if pgErr.Detail != "" {
			what += " (" + strings.ReplaceAll(pgErr.Detail, "\n", "; ") + ")"
		}
		return fmt.Errorf("migration %d down: %w: %s; remove them yourself (or move them off gendurable's tables), "+
			"then migrate again; nothing of version %d was applied", version, ErrDependents, what, version)
	}
	return trialErr
}

// DefaultIsolation reads the isolation level a statement of db runs at
// outside an explicit transaction: the level of the pick's own implicit
// transaction, which the pick refuses unless it is read committed. It reads
// it in a transaction of its own, begun without a level (so at that same
// default): a pooler that cannot run transaction blocks (PgBouncer in
// statement pooling) fails it, as it would fail WithTx outcomes
// (StatementPooling).
func DefaultIsolation(ctx context.Context, db Beginner) (string, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var level string
	if err := tx.QueryRow(ctx, `SELECT current_setting('transaction_isolation')`).Scan(&level); err != nil {
		return "", err
	}
	return level, tx.Commit(ctx)
}

// MigrationScript is the SQL that migrates schema from version from to
// version to (up when to > from, down when to < from) with the version
// comment, for users who apply migrations with their own tool; from == to is
// empty. Like Migrate, it creates the schema only on an install from version
// 0 and only when it is missing: PostgreSQL checks the database's CREATE
// privilege before IF NOT EXISTS, so a role that owns its schema but may not
// create schemas could not run a bare CREATE SCHEMA IF NOT EXISTS. The
// versions must be within 0..LatestVersion() and schema valid.
func MigrationScript(schema string, from, to int) (string, error) {
	if err := ValidateSchema(schema); err != nil {
		return "", err
	}
	if latest := LatestVersion(); from < 0 || to < 0 || from > latest || to > latest {
		return "", fmt.Errorf("versions must be within 0..%d", latest)
	}
	var b strings.Builder
	q := quoteIdent(schema)
	ms := migrations()
	if to != from {
		fmt.Fprintf(&b, "-- gendurable schema %d -> %d. Each version is a transaction of its own (BEGIN ... COMMIT), as\n"+
			"-- migrate up and down run them, and first checks that the schema is at the version it starts from: a\n"+
			"-- version refused (a check below raises) is rolled back whole, and so is every later one. Run it as it\n"+
			"-- is (psql -v ON_ERROR_STOP=1 -f FILE), not inside a transaction of your own (psql -1): one\n"+
			"-- transaction for several versions holds the first ALTER TABLE's exclusive lock through every later\n"+
			"-- version. On a database in use, set a lock_timeout for the session first (PGOPTIONS='-c\n"+
			"-- lock_timeout=500ms') and run it again if it fails with SQLSTATE 55P03: a statement waiting for a\n"+
			"-- table lock queues every worker's statement behind it.\n",
			from, to)
	}
	comment := func(v int) {
		if !strings.HasSuffix(b.String(), "\n") {
			b.WriteString("\n")
		}
		if v > 0 {
			b.WriteString(versionComment(schema, v) + ";\n")
		}
		b.WriteString("COMMIT;\n")
	}
	switch {
	case to > from:
		if from == 0 {
			// The name is a literal: ValidateSchema allows no quote.
			fmt.Fprintf(&b, "DO $gendurable$ BEGIN\n  IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = '%s') THEN\n    CREATE SCHEMA %s;\n  END IF;\nEND $gendurable$;\n", schema, q)
		}
		prev := 0 // the version before m
		for _, m := range ms {
			if m.Version > from && m.Version <= to {
				sql := m.Up(schema)
				fmt.Fprintf(&b, "\n-- gendurable migration %d (%s) up\nBEGIN;\n", m.Version, m.Name)
				b.WriteString(scriptVersionGuard(schema, m.Version, "up", prev))
				if prev == from {
					b.WriteString(scriptTableGuard(schema, ms, from, to))
				}
				b.WriteString(scriptGuardsBefore(schema, m.Version, "up", sql))
				b.WriteString(sql)
				if g := scriptGuardAfter(schema, m.Version, "up", sql); g != "" {
					if !strings.HasSuffix(sql, "\n") {
						b.WriteString("\n")
					}
					b.WriteString(g)
				}
				comment(m.Version)
			}
			prev = m.Version
		}
	case to < from:
		first := true
		for i := len(ms) - 1; i >= 0; i-- {
			if m := ms[i]; m.Version <= from && m.Version > to {
				sql := m.Down(schema)
				fmt.Fprintf(&b, "\n-- gendurable migration %d (%s) down\nBEGIN;\n", m.Version, m.Name)
				b.WriteString(scriptVersionGuard(schema, m.Version, "down", m.Version))
				// The version's own index names first, then, before the
				// first version, what every version to go would drop: in
				// the order migrate down checks them, so the first refusal
				// is the same one.
				b.WriteString(scriptGuardsBefore(schema, m.Version, "down", sql))
				if first {
					b.WriteString(scriptDownGuards(schema, m.Version, ms, to, from))
					first = false
				}
				b.WriteString(sql)
				if g := scriptGuardAfter(schema, m.Version, "down", sql); g != "" {
					if !strings.HasSuffix(sql, "\n") {
						b.WriteString("\n")
					}
					b.WriteString(g)
				}
				if i > 0 {
					comment(ms[i-1].Version)
				} else {
					comment(0) // version 1's down drops the table and its comment
				}
			}
		}
	}
	return b.String(), nil
}

// The guards of a printed script (MigrationScript) are the checks migrate
// up and down make around each version (checkIndexNames, checkColumnNames,
// checkDependents, trialDown), as DO blocks that raise the same message:
// a team that runs the script with its own tool has a version refused with
// nothing of it applied where migrate would refuse it (each version is a
// transaction of its own, checked first for the version it starts from:
// scriptVersionGuard). Before, the
// script skipped the build of an index left invalid by a failed
// CREATE INDEX CONCURRENTLY (every pick then scanned), took a column of
// the user's over as gendurable's, and dropped what hung on a dropped
// column without a word.

// scriptVersionGuard is the guard at the head of a version's transaction:
// the schema is at version at, where the version starts from (the comment
// migrate reads, InstalledVersion; no instances table is version 0).
// migrate reads the version under its lock before each step; a script
// printed for another starting version, or run again, or whose earlier
// version was refused, would otherwise apply a version on a schema it was
// not written for and record it (a probe: a script printed --from 22 run on
// version 19 recorded 23, and every pick then failed on a function of 20).
// It takes migrate's lock first (migrateLock), held until the version's
// transaction ends: a migrate up or down cannot move the schema between
// the check and the version's statements.
func scriptVersionGuard(schema string, version int, way string, at int) string {
	table := quoteLiteral(quoteIdent(schema) + ".gendurable_instances")
	msg := fmt.Sprintf("migration %d %s: schema %q is not at version %d, where this version starts (its "+
		"gendurable_instances table says: %s): the script was printed for another version, or a version before this "+
		"one was refused; print it again with --from the schema's version (gendurable migrate status shows it); "+
		"nothing of version %d was applied", version, way, schema, at, guardValue, version)
	return fmt.Sprintf("-- The schema is at version %d (migrate checks this too, under the same lock), and the version's\n"+
		"-- transaction waits at most %d ms on its client, as migrate's (a script stopped part way must not\n"+
		"-- hold the tables' locks).\n"+
		"DO $gendurable$\nDECLARE found text;\nBEGIN\n"+
		"  PERFORM %s;\n"+
		"  PERFORM pg_advisory_xact_lock(hashtext('gendurable.migrate.' || %s));\n"+
		"  SELECT CASE WHEN to_regclass(%s) IS NULL THEN '%s0'\n"+
		"              ELSE coalesce(obj_description(to_regclass(%s), 'pg_class'), '(no version comment)') END INTO found;\n"+
		"  IF found IS DISTINCT FROM '%s%d' THEN\n"+
		"    RAISE EXCEPTION USING MESSAGE = format(%s, quote_literal(found));\n  END IF;\nEND $gendurable$;\n",
		at, MigrateIdleLimit.Milliseconds(), idleLimitAtMost(MigrateIdleLimit.Milliseconds()),
		quoteLiteral(schema), table, versionCommentPrefix, table, versionCommentPrefix, at, raiseFormat(msg))
}

// scriptGuardsBefore is the guard that runs before a version's sql: the
// indexes it drops are gendurable's, and going up, the columns it adds
// are not there yet.
func scriptGuardsBefore(schema string, version int, way, sql string) string {
	var b strings.Builder
	if names := indexNames(dropIndex, sql); len(names) > 0 {
		b.WriteString(scriptGuard(indexNamesSQL, []string{quoteLiteral(schema), textArray(names), "false"},
			func(v string) string { return foreignIndexMsg(schema, version, way, v) }, nil))
	}
	if tables, columns := addedColumns(sql); way == "up" && len(columns) > 0 {
		b.WriteString(scriptGuard(columnNamesSQL, []string{quoteLiteral(schema), textArray(tables), textArray(columns)},
			func(v string) string { return takenColumnMsg(schema, version, v) }))
	}
	return b.String()
}

// scriptGuardAfter is the guard that runs after a version's sql: what a
// build "if not exists" skipped is gendurable's own index, and going up,
// a valid one.
func scriptGuardAfter(schema string, version int, way, sql string) string {
	names := indexNames(ifNotExistsIndex, sql)
	if len(names) == 0 {
		return ""
	}
	return scriptGuard(indexNamesSQL, []string{quoteLiteral(schema), textArray(names), strconv.FormatBool(way == "up")},
		func(v string) string { return foreignIndexMsg(schema, version, way, v) },
		func(v string) string { return invalidIndexMsg(schema, version, way, v) })
}

// scriptDownGuards is the guard of a down script's first version (the
// newest): nothing outside the schema hangs on what the versions from
// down to to drop (checkDependents), and their downs, tried in a
// subtransaction rolled back, raise no dependent_objects_still_exist
// (trialDown).
func scriptDownGuards(schema string, version int, ms []Migration, to, from int) string {
	var rest, trial strings.Builder
	for i := len(ms) - 1; i >= 0; i-- { // newest first, as they run
		if ms[i].Version > to && ms[i].Version <= from {
			rest.WriteString(ms[i].Down(schema) + "\n")
			trial.WriteString(ms[i].Down(schema) + ";\n")
		}
	}
	var b strings.Builder
	if tables, columns := droppedColumns(rest.String()); len(tables) > 0 {
		ownTables, ownColumns := gendurableColumns()
		b.WriteString(scriptGuard(dependentsSQL, []string{quoteLiteral(schema), textArray(tables), textArray(columns),
			textArray(ownTables), textArray(ownColumns)},
			func(v string) string {
				return fmt.Sprintf("migration %d down: %s: %s", version, ErrDependents, dependentsAdvice(version, v))
			}))
	}
	msg := raiseFormat(fmt.Sprintf("migration %d down: %s: %s; remove them yourself (or move them off gendurable's tables), "+
		"then migrate again; nothing of version %d was applied", version, ErrDependents, guardValue, version))
	fmt.Fprintf(&b, `DO $gendurable$
DECLARE m text; d text;
BEGIN
  -- The downs, tried first and rolled back: what would stop them part way
  -- (something that depends on a table or column they drop) stops them here.
  BEGIN
    EXECUTE $gendurable_trial$
%s$gendurable_trial$;
    RAISE EXCEPTION 'trial done' USING ERRCODE = 'GD000';
  EXCEPTION
    WHEN SQLSTATE 'GD000' THEN NULL;
    WHEN dependent_objects_still_exist THEN
      GET STACKED DIAGNOSTICS m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL;
      RAISE EXCEPTION USING MESSAGE = format(%s,
        m || CASE WHEN d <> '' THEN ' (' || replace(d, E'\n', '; ') || ')' ELSE '' END);
  END;
END $gendurable$;
`, trial.String(), msg)
	return b.String()
}

// guardValue stands for the value a guard's message names until
// raiseFormat makes it format's %s.
const guardValue = "\x00"

// raiseFormat is msg (holding guardValue once) as a literal for format():
// its own % doubled, guardValue as %s.
func raiseFormat(msg string) string {
	return quoteLiteral(strings.ReplaceAll(strings.ReplaceAll(msg, "%", "%%"), guardValue, "%s"))
}

// scriptGuard is a DO block that runs query with args written in for $1,
// $2, … (literals of validated names only) and raises msgs[i](value) for
// the first of its text columns i that is not NULL.
func scriptGuard(query string, args []string, msgs ...func(string) string) string {
	pairs := make([]string, 0, 2*len(args))
	for i := len(args) - 1; i >= 0; i-- { // $1 after $10, were there ten
		pairs = append(pairs, "$"+strconv.Itoa(i+1), args[i])
	}
	var checks strings.Builder
	for i, msg := range msgs {
		if msg == nil {
			continue
		}
		v := "v" + strconv.Itoa(i+1)
		fmt.Fprintf(&checks, "  IF %s IS NOT NULL THEN\n    RAISE EXCEPTION USING MESSAGE = format(%s, %s);\n  END IF;\n",
			v, raiseFormat(msg(guardValue)), v)
	}
	all := make([]string, len(msgs))
	for i := range msgs {
		all[i] = "v" + strconv.Itoa(i+1)
	}
	return fmt.Sprintf("-- A check migrate makes too: it refuses the version, nothing of it applied (see the message).\n"+
		"DO $gendurable$\nDECLARE %s text;\nBEGIN\n  SELECT q.* INTO %s FROM (\n%s\n  ) AS q;\n%sEND $gendurable$;\n",
		strings.Join(all, " text; "), strings.Join(all, ", "), strings.NewReplacer(pairs...).Replace(query), checks.String())
}

// quoteLiteral is s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// textArray is names as an SQL text[] literal.
func textArray(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = quoteLiteral(n)
	}
	return "ARRAY[" + strings.Join(q, ", ") + "]::text[]"
}
