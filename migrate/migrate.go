// Package migrate installs, upgrades and removes gendurable's tables.
//
// The schema is the library's own: embedded, versioned SQL with an up and a
// down for every version. The installed version is recorded in the database
// (as the comment on gendurable_instances), so Up applies only what is
// missing and several processes may call it at once. Users who run their own
// migration tool can print the SQL with SQL and paste it into their files.
// Each version in it is a transaction of its own (BEGIN … COMMIT): run a
// file as it is, outside any transaction your tool opens around it — one
// that wraps each file in a transaction (goose's default, Flyway's) has it
// committed by the file's first COMMIT; mark the file to run without one
// (goose: -- +goose NO TRANSACTION).
//
//	if _, err := migrate.Up(ctx, pool, "public"); err != nil { ... }
package migrate

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
)

// DB is a pool or connection that can open a transaction and run a query
// (*pgxpool.Pool and *pgx.Conn both are).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrInvalidSchema is returned (wrapped) for a schema name that is not a plain identifier.
var ErrInvalidSchema = sqlq.ErrInvalidSchema

// ErrSchemaVersion is returned (wrapped) for a schema at a version newer
// than this library knows (a newer process migrated it: upgrade this one),
// or whose version comment is missing or unreadable (a dump restored with
// --no-comments). It is gendurable.ErrSchemaVersion. Such errors wrap
// ErrSchemaUnknown too, which a schema merely older than the library's
// (migrate up mends it) does not.
var ErrSchemaVersion = sqlq.ErrSchemaVersion

// ErrSchemaUnknown is wrapped, beside ErrSchemaVersion, by the errors of a
// schema whose version this library cannot migrate from: newer than it
// knows, or a version comment missing or unreadable.
var ErrSchemaUnknown = sqlq.ErrSchemaUnknown

// ErrDependents: a down (Down, To or DownTo to a lower version) was
// refused before its first version, nothing applied, because something
// that is not gendurable's depends on a table or a column it would drop —
// a view, another table's foreign key, a constraint trigger or statistics
// elsewhere, a table that inherits from one of them (whose inherited
// columns a down's DROP COLUMN would drop with their data): the drop would
// take it along, or fail on it part way. The
// message names them; remove them (or move them off gendurable's tables),
// then migrate again. It is also every call's error (Up, Down, To,
// Installed; the root package's Engine.Start and the CLI's commands) on a
// schema where a table inherits from one of gendurable's (CREATE TABLE …
// INHERITS): PostgreSQL's statements on a parent take in its children's
// rows, so gendurable would list, retry, run and prune rows it did not make.
// The message names the table; ALTER TABLE … NO INHERIT detaches it.
var ErrDependents = sqlq.ErrDependents

// Latest is the newest schema version this library ships.
func Latest() int { return sqlq.LatestVersion() }

// Result says what a migration did.
//
// Migrators running at once (several processes starting together) take
// turns version by version, each under the migration's lock: each applies
// the versions its Applied lists and no other, From is the version its
// first turn found, and To the version its last turn found or left — which
// may be past an UpTo's target when another migrator's Up went on (the
// schema is then at least at the target: no error).
type Result struct {
	From    int   // version installed before (its first turn's, with migrators at once)
	To      int   // version installed after (with an error: the version reached)
	Applied []int // versions applied, in order (empty when there was nothing to do); with an error, those committed
}

// Up migrates schema to the latest version, creating the schema if needed.
// The role needs CREATE on the schema (its owner has it); the database's
// CREATE privilege only when the schema does not exist yet.
func Up(ctx context.Context, db DB, schema string) (Result, error) {
	return To(ctx, db, schema, Latest())
}

// Down removes every gendurable table from schema (version 0). The schema
// itself is left in place (and one that does not exist is not created).
// All instances and signals are lost.
func Down(ctx context.Context, db DB, schema string) (Result, error) {
	return To(ctx, db, schema, 0)
}

// To migrates schema up or down to target, one version per transaction:
// an upgrade over several versions holds each version's table locks only
// while that version runs, and one that fails or is interrupted keeps the
// versions it committed (Result.To and Result.Applied say which; the
// schema is then at that version, a consistent one, and migrating again
// goes on from it). Each statement waits at most half a second for a lock
// another transaction holds on the tables (so the workers' statements that
// queue behind the migration's lock request are not held up for longer);
// the version is then tried again, after a pause (1 s, doubling up to
// 30 s), until ctx ends. A deadlock is tried again the same way. In a
// transaction of the caller's (db a pgx.Tx) neither is tried again but
// returned: rolled back to its savepoint, the version would keep the locks
// the transaction took before it, which what it waits for may be waiting
// for; nothing is committed there, whatever Result says, until the caller
// commits.
//
// Down migrations drop what the versions they remove added: the data in
// those columns and tables is lost, and migrating up again does not bring
// it back (down past version 2, for one, loses every inbox, fan-out and
// join count: parked and joining instances never wake). Move down only to
// undo an upgrade that nothing has run on yet, or with nothing in flight.
func To(ctx context.Context, db DB, schema string, target int) (Result, error) {
	return to(ctx, db, schema, target, 0)
}

// ErrDirection is returned (wrapped) by UpTo when the installed version is
// above its target, and by DownTo when it is below: read under the
// migration's lock, so another migrator that moved the schema after the
// caller looked is caught. Nothing was applied. Any migration (To, Up,
// Down too) also returns it when, after applying some versions, it finds
// the schema moved back the other way by another migrator (an up and a
// down at once): it stops there, Result.Applied and Result.To saying what
// it did and where the schema is.
var ErrDirection = sqlq.ErrMigrateDirection

// UpTo migrates schema up to target, as To does, but never down: a schema
// installed above target is left as it is, with an error wrapping
// ErrDirection.
func UpTo(ctx context.Context, db DB, schema string, target int) (Result, error) {
	return to(ctx, db, schema, target, 1)
}

// DownTo migrates schema down to target, as To does, but never up: a schema
// installed below target is left as it is, with an error wrapping
// ErrDirection. What a down migration loses is said at To.
func DownTo(ctx context.Context, db DB, schema string, target int) (Result, error) {
	return to(ctx, db, schema, target, -1)
}

// ErrNilArgument: a nil context or database was passed (a typed error, not
// a nil dereference inside).
var ErrNilArgument = errors.New("gendurable: migrate: nil context or database")

// nilArgument is ErrNilArgument for a nil ctx or db.
func nilArgument(ctx context.Context, db DB) error {
	if ctx == nil || db == nil || isNilPointer(db) {
		return ErrNilArgument
	}
	return nil
}

// isNilPointer reports whether db is a typed nil pointer (a nil
// *pgxpool.Pool passed as a DB).
func isNilPointer(db DB) bool {
	v := reflect.ValueOf(db)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

func to(ctx context.Context, db DB, schema string, target, dir int) (Result, error) {
	if err := nilArgument(ctx, db); err != nil {
		return Result{}, err
	}
	if err := sqlq.ValidateSchema(schema); err != nil {
		return Result{}, fmt.Errorf("gendurable: %w", err)
	}
	from, now, applied, err := sqlq.MigrateDir(ctx, db, schema, target, dir)
	r := Result{From: from, To: now, Applied: applied}
	if err != nil {
		if _, callersTx := db.(pgx.Tx); callersTx && len(applied) > 0 {
			// Nothing is committed in a caller's transaction: its rollback
			// undoes the versions applied too.
			return r, fmt.Errorf("gendurable: migrate %q to %d: stopped at version %d (versions %v applied in the caller's transaction, "+
				"which commits or rolls them back): %w", schema, target, r.To, applied, err)
		}
		if len(applied) > 0 {
			return r, fmt.Errorf("gendurable: migrate %q to %d: stopped at version %d (versions %v committed): %w",
				schema, target, r.To, applied, err)
		}
		return r, fmt.Errorf("gendurable: migrate %q to %d: %w", schema, target, err)
	}
	return r, nil
}

// Installed reports the schema version installed in schema (0 if none).
func Installed(ctx context.Context, db DB, schema string) (int, error) {
	if err := nilArgument(ctx, db); err != nil {
		return 0, err
	}
	if err := sqlq.ValidateSchema(schema); err != nil {
		return 0, fmt.Errorf("gendurable: %w", err) // not "read the version installed in": nothing was read (a probe)
	}
	v, err := sqlq.InstalledVersion(ctx, db, schema)
	if err != nil {
		return 0, fmt.Errorf("gendurable: read the schema version installed in %q: %w", schema, err)
	}
	return v, nil
}

// SQL returns the SQL that migrates schema from version from to version to
// (up when to > from, down when to < from), with the version comment, for
// users who apply migrations with their own tool. Like Up, an install from
// version 0 creates the schema only if it is missing (so a role that owns
// its schema but may not create schemas can run it); no other script
// creates it. Around each version the script makes the checks Up and Down
// make (an invalid or foreign index of a name it builds or drops, a column
// of the user's under a name it adds, what hangs on what a down drops, the
// downs tried first), as DO blocks that raise the same message. Each
// version is a transaction of its own (BEGIN … COMMIT) that first checks
// the schema is at the version it starts from, so a refused version applies
// nothing and neither does any after it, even run by a tool that goes on
// after an error; run the script as it is, not inside a transaction of
// your own. from == to gives an empty script.
func SQL(schema string, from, to int) (string, error) {
	s, err := sqlq.MigrationScript(schema, from, to)
	if err != nil {
		return "", fmt.Errorf("gendurable: migrate: %w", err)
	}
	return s, nil
}
