// Package scratch gives `gendurable demo` and `gendurable bench` a schema of
// their own. They drop and recreate it on every run, so they must never be
// pointed at a schema that holds someone's data: a schema they create is
// marked (a comment on the schema), and an existing schema without the mark
// is refused — whatever it holds, gendurable tables with live instances
// included — unless the operator asks for a reset, and confirms it when a
// prompt is possible; even then only a schema that is empty or holds
// gendurable's objects alone is dropped, never public (keepForeign), and
// without CASCADE. A marked schema is dropped without CASCADE, so one
// that someone added an object to, or that an object elsewhere depends on,
// is refused the same way, and so is one whose tables someone added to (a
// column, an index, a trigger, a policy…: what a schema migrated to the same
// version does not have); so is one holding rows the command did not put
// there (instances or definitions of machines it does not run, an
// operator's paused queue). The quickstart example (examples/quickstart)
// uses it too: Prepare for its demo, Ensure for the insert, work and status
// commands that keep what an earlier run left.
package scratch

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotScratch: the schema exists and is not demo's or bench's to drop
// (they did not create it, or it holds what they did not write); nothing
// was changed. Pass Reset (--reset-schema) to drop it anyway.
var ErrNotScratch = errors.New("schema is not one that gendurable's demo, bench or quickstart may drop")

// ErrBusy: the schema's tables are in use — another transaction held a
// lock the drop needed past its wait (another demo or bench running in the
// schema, a long query) — and nothing was changed.
var ErrBusy = errors.New("schema is in use")

// errInUse: another run holds the schema's use (Use); wraps ErrBusy, and
// is not tried again.
var errInUse = fmt.Errorf("%w by another run", ErrBusy)

// ErrAborted: the operator declined the reset; nothing was changed.
var ErrAborted = errors.New("aborted: schema left as it was")

// Options tune Prepare.
type Options struct {
	// Owner names the command in the schema's mark: "demo", "bench".
	Owner string
	// Reset drops an existing schema that is not marked (the operator's
	// explicit --reset-schema). Default false: such a schema is refused.
	Reset bool
	// Confirm, if set, is asked before an unmarked schema is dropped (a
	// prompt on a terminal); false aborts with ErrAborted.
	Confirm func(question string) (bool, error)
	// Logger, if set, gets one Warn line when an unmarked schema is
	// dropped (Reset): the audit trail of a drop of what the command did
	// not create. A marked schema's drop is not logged: it is the
	// command's own.
	Logger *slog.Logger
	// Hold, if set, is the run's use of the schema (Use), taken before
	// Prepare: the drop runs on its connection (a session's own shared
	// lock does not stop its drop), so that no other run can drop the
	// schema between this one's drop and its hold.
	Hold *Hold
	// Remedy, if set, replaces the advice that ends ErrNotScratch's message
	// (default: choose another --schema, or pass --reset-schema), for a
	// caller that has no such flags.
	Remedy string
	// ForeignRemedy, if set, replaces the advice that ends the refusal of a
	// schema holding someone's objects (default: choose another --schema),
	// for a caller whose Remedy would not fit (a DROP SCHEMA … CASCADE
	// right after naming someone's table).
	ForeignRemedy string
}

// shared names the machines of every scratch command linked into this
// program (Share): a marked schema that holds instances or definitions of
// any other machine, or a queue row (which only an operator's pause
// writes), holds someone else's data and is refused like an unmarked one.
// Bench may reuse the demo's schema and the demo bench's, so the rows of
// either are the other's to drop too.
var shared struct {
	sync.Mutex
	names []string
}

// Share records machines a scratch command of this program runs (called
// from its package's init): Prepare and Drop drop a marked schema only
// while every row in it is of a machine shared so.
func Share(names ...string) {
	shared.Lock()
	defer shared.Unlock()
	shared.names = append(shared.names, names...)
}

// own is every shared machine name.
func own() []string {
	shared.Lock()
	defer shared.Unlock()
	return slices.Clone(shared.names)
}

const defaultRemedy = "choose another --schema, or pass --reset-schema to drop it with any gendurable instances it holds (with --yes when stdin is not a terminal)"

func (o Options) remedy() string {
	if o.Remedy != "" {
		return o.Remedy
	}
	return defaultRemedy
}

// Prepare leaves schema freshly created, marked and migrated to the latest
// version. A marked schema (an earlier run's) is dropped first; an existing
// unmarked one is refused with ErrNotScratch unless o.Reset.
func Prepare(ctx context.Context, db *pgxpool.Pool, schema string, o Options) error {
	info, err := sqlq.InspectSchema(ctx, db, schema)
	if err != nil {
		return fmt.Errorf("inspect schema %q: %w", schema, err)
	}
	created := info.Exists && info.Scratch() // by demo, bench or quickstart, whatever it holds now
	creator := creatorOf(info)
	on := o.Hold.or(db)
	if info.Exists {
		// Whatever the flags say, marked or not: never the public schema,
		// never someone's objects, refused at once and named (checked
		// again in a reset's transaction: dropReset) — before dropOwn
		// locks every table of a marked schema, theirs too: their writers
		// waited behind the lock for up to three tries, and the refusal
		// blamed another run (a probe).
		if err := keepForeign(ctx, db, schema, o); err != nil {
			return err
		}
	}
	if created {
		// An earlier run's: dropped if it holds only what gendurable put
		// there and nothing elsewhere depends on it.
		err := dropOwn(ctx, on, schema, creator)
		switch {
		case err == nil:
			info.Exists = false
		case ctx.Err() != nil && !errors.Is(err, ErrNotScratch):
			// Stopped (Ctrl-C) while it dropped: the drop is one
			// transaction, rolled back unless it had committed, never half
			// done (migrate's message about versions applied in the
			// caller's transaction read as damage).
			return fmt.Errorf("drop schema %q: stopped while dropping it (one transaction: the schema is as it was, unless the stop came as it committed): %w", schema, context.Cause(ctx))
		case !errors.Is(err, ErrNotScratch):
			return fmt.Errorf("drop schema %q: %w", schema, err)
		case !o.Reset:
			return fmt.Errorf("%w; %s", err, o.remedy())
		default:
			info.Comment = "" // the explicit reset below, confirmed like any other
		}
	}
	if info.Exists && !info.Scratch() {
		what := describe(info)
		if !o.Reset {
			return fmt.Errorf("%w: %q %s and was not created by gendurable %s; %s", ErrNotScratch, schema, what, o.Owner, o.remedy())
		}
		if created {
			what += ", some of it not written by " + creator
		} else {
			what += " and was not created by gendurable " + o.Owner
		}
		// What dropReset refuses after the prompt, refused before it.
		if err := resetRefusal(ctx, on, schema, o.Owner); err != nil {
			return err
		}
		if o.Confirm != nil {
			ok, err := o.Confirm(fmt.Sprintf("schema %q %s. Drop it and everything in it?", schema, what))
			if err != nil {
				return err
			}
			if !ok {
				return ErrAborted
			}
		}
	}
	if info.Exists {
		if err := dropReset(ctx, on, schema, o.Owner); err != nil {
			return fmt.Errorf("drop schema %q: %w", schema, err)
		}
		if o.Logger != nil && !info.Scratch() {
			why := "it was not created by gendurable " + o.Owner
			if created {
				why = "it held what " + creator + " did not write"
			}
			o.Logger.Warn("gendurable: schema dropped (--reset-schema): "+why, "schema", schema, "held", describe(info))
		}
	}
	if err := sqlq.CreateScratchSchema(ctx, db, schema, o.Owner); err != nil {
		return fmt.Errorf("create schema %q: %w", schema, err)
	}
	if _, err := migrate.Up(ctx, db, schema); err != nil {
		return err
	}
	return nil
}

// Ensure leaves schema created, marked and migrated to the latest version,
// keeping what earlier runs left in it: a missing schema is created and
// marked, a marked one is migrated up, and an existing unmarked one is
// refused with ErrNotScratch (nothing changed; o.Reset and o.Confirm do not
// apply). It is for commands that work in their schema across several runs
// (the quickstart example's insert, work and status), where Prepare would
// drop the instances an earlier run inserted. It returns the run's Hold
// (Use), taken first: release it when the command ends.
func Ensure(ctx context.Context, db *pgxpool.Pool, schema string, o Options) (*Hold, error) {
	// In use from the start (before the schema exists, even): no other
	// run's Prepare drops it under this one.
	h, err := Use(ctx, db, schema)
	if err != nil {
		return nil, err
	}
	if err := ensure(ctx, db, schema, o); err != nil {
		h.Release()
		return nil, err
	}
	return h, nil
}

func ensure(ctx context.Context, db *pgxpool.Pool, schema string, o Options) error {
	for range 2 { // a second time if another process created the schema meanwhile
		info, err := sqlq.InspectSchema(ctx, db, schema)
		if err != nil {
			return fmt.Errorf("inspect schema %q: %w", schema, err)
		}
		if info.Exists && !info.Scratch() {
			if err := keepForeign(ctx, db, schema, o); err != nil {
				return err // naming someone's objects in it
			}
			return fmt.Errorf("%w: %q %s and was not created by gendurable %s; %s", ErrNotScratch, schema, describe(info), o.Owner, o.remedy())
		}
		if !info.Exists {
			err = sqlq.CreateScratchSchema(ctx, db, schema, o.Owner)
			var pgErr *pgconn.PgError
			// Created by another process meanwhile: inspect it again. Two
			// CREATE SCHEMA at once may also end in 23505, the catalog's
			// unique index refusing the second, rather than 42P06.
			if errors.As(err, &pgErr) && (pgErr.Code == "42P06" || pgErr.Code == "23505") {
				continue
			}
			if err != nil {
				return fmt.Errorf("create schema %q: %w", schema, err)
			}
		}
		_, err = migrate.Up(ctx, db, schema)
		return err
	}
	return fmt.Errorf("create schema %q: created and dropped again by another process meanwhile", schema)
}

// Drop drops schema if it carries the scratch mark and holds only what
// gendurable put there — of rows, only instances and definitions of the
// machines of Share — and leaves it alone otherwise (ErrNotScratch when
// something else is in it or depends on it).
func Drop(ctx context.Context, db *pgxpool.Pool, schema string) error {
	return DropHeld(ctx, db, schema, nil)
}

// DropHeld is Drop for a run that holds the schema's use (h, from Use; nil
// is Drop): the drop runs on the hold's connection, whose own lock does
// not stop it, where another run's does.
func DropHeld(ctx context.Context, db *pgxpool.Pool, schema string, h *Hold) error {
	info, err := sqlq.InspectSchema(ctx, db, schema)
	if err != nil || !info.Exists || !info.Scratch() {
		return err
	}
	return dropOwn(ctx, h.or(db), schema, creatorOf(info))
}

// dropOwn drops a marked schema, in one transaction, without CASCADE:
// gendurable's own objects one by one (migrate.Down, which names each of
// them), then the schema itself. An object someone added to the schema, or
// one elsewhere that depends on gendurable's tables (a view, a foreign
// key: SQLSTATE 2BP01; a constraint trigger, whose dependency is automatic:
// sqlq.ErrDependents), stops it: then nothing is dropped and the error
// wraps ErrNotScratch; so does anything added to gendurable's tables
// themselves, which a drop would take with them without a word (a column
// and what it holds, an index, a trigger: additions); so do rows of machines not shared (Share), and queue
// rows (sqlq.ForeignRows: it looks once without a lock, then again with the
// tables locked, so nothing is added between the look and the drop). The mark says the schema was created by
// demo or bench, not that all it holds is theirs.
//
// A drop whose lock wait ran out is tried again twice, a second apart, each
// time in a new transaction (its locks freed between: what it waited for —
// an autovacuum, which PostgreSQL cancels for a lock request only after
// deadlock_timeout — may be waiting for them), then is ErrBusy.
func dropOwn(ctx context.Context, db beginner, schema, creator string) error {
	for try := 1; ; try++ {
		err := dropOwnOnce(ctx, db, schema, creator)
		// A catalog entry dropped under the drop's catalog reads by another
		// transaction (another schema's drop: sqlq.CatalogRace) is tried
		// again too; in the drop's own transaction the migration does not.
		if !errors.Is(err, ErrBusy) && !sqlq.CatalogRace(err) || errors.Is(err, errInUse) || try == 3 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}

// dropOwnOnce is one try of dropOwn, in one transaction.
func dropOwnOnce(ctx context.Context, db beginner, schema, creator string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	err = dropOwnTx(ctx, tx, schema, creator)
	if sqlq.LockTimedOut(err) || sqlq.Deadlocked(err) {
		// The rollback frees the locks taken: whatever waited on them (the
		// workers of another run in the schema) goes on.
		return fmt.Errorf("%w: %q: another transaction holds its tables (another demo or bench running in it?), "+
			"and nothing was dropped: wait for it to end, or use another schema (%v)", ErrBusy, schema, err)
	}
	if err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// creatorOf names, for a message, what created a marked schema: the
// command its mark names ("gendurable quickstart": a newcomer's probe read
// "created by gendurable demo or bench" of the quickstart's schema).
func creatorOf(info sqlq.SchemaInfo) string {
	if c := info.Creator(); c != "" {
		return "gendurable " + c
	}
	return "gendurable demo, bench or quickstart"
}

// dropOwnTx is dropOwn's work in its transaction tx; creator names what
// created the schema (creatorOf), for its messages.
func dropOwnTx(ctx context.Context, tx pgx.Tx, schema, creator string) error {
	// First, before any table lock: a run using the schema (Use) makes
	// this drop give up at once. Its locks taken while the run's workers
	// wrote, a second demo had deadlocked with the first, which died
	// (a newcomer's probe), or held a quickstart worker's outcome
	// up past its deadline.
	if err := refuseHeld(ctx, tx, schema); err != nil {
		return err
	}
	foreign, err := sqlq.ForeignRows(ctx, tx, schema, own())
	if err != nil {
		return err
	}
	if foreign != "" {
		return fmt.Errorf("%w: %q was created by %s, but holds rows this program did not write: %s",
			ErrNotScratch, schema, creator, foreign)
	}
	added, err := additions(ctx, tx, schema)
	if err != nil {
		return err
	}
	if len(added) > 0 {
		return fmt.Errorf("%w: %q was created by %s, but holds what a schema migrated to the same version "+
			"does not (someone added or changed it, or an older gendurable built it otherwise): %s",
			ErrNotScratch, schema, creator, listAdded(added))
	}
	if _, err = migrate.Down(ctx, tx, schema); err == nil {
		err = sqlq.DropEmptySchema(ctx, tx, schema)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "2BP01" {
		return fmt.Errorf("%w: %q was created by %s, but holds objects it did not create, "+
			"or objects elsewhere depend on it (%s)", ErrNotScratch, schema, creator, pgDetail(pgErr))
	}
	if errors.Is(err, sqlq.ErrDependents) {
		return fmt.Errorf("%w: %q was created by %s, but objects elsewhere depend on it (%v)",
			ErrNotScratch, schema, creator, err)
	}
	return err
}

// dropReset drops schema — gendurable's objects in it, instances and all,
// and nothing else (keepForeign) — on the operator's confirmed
// --reset-schema, unless a run holds its use (Use): checked in the drop's
// own transaction, after the prompt. Checked before it only, a reset that
// waited on its y/N prompt dropped the schema a quickstart worker had
// started in meanwhile (a hostile operator's probe).
func dropReset(ctx context.Context, on beginner, schema, owner string) error {
	tx, err := on.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := refuseHeld(ctx, tx, schema); err != nil {
		return err
	}
	// A library worker holds no use of the schema (Use is the commands'):
	// its running steps' live leases say it is there. --reset-schema
	// --yes dropped a schema under such a worker (an operator probe).
	// The tables are locked against writes first, so no claim commits
	// between the count and the drop.
	if err := sqlq.LockSchemaTables(ctx, tx, schema); err != nil {
		return err
	}
	if n, err := sqlq.LiveClaims(ctx, tx, schema); err != nil {
		return err
	} else if n > 0 {
		return fmt.Errorf("%w: %q: %d %s running in it under live leases (a worker is using it), and nothing was dropped: "+
			"stop its workers, or use another schema", errInUse, schema, n, plural(n, "instance is", "instances are"))
	}
	// What the prompt was asked about, unless something was added since:
	// gendurable's objects go one by one (migrate's down, which refuses
	// what depends on them from outside the schema), then the schema
	// without CASCADE, which refuses what is left. Before, a CASCADE drop
	// took someone's tables with it, in public too (an operator probe).
	if err := keepForeign(ctx, tx, schema, Options{Owner: owner}); err != nil {
		return err
	}
	if err := refuseAdded(ctx, tx, schema, owner); err != nil {
		return err
	}
	_, err = migrate.Down(ctx, tx, schema)
	if err == nil {
		err = sqlq.DropEmptySchema(ctx, tx, schema)
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "2BP01":
		return fmt.Errorf("%w: %q holds objects gendurable did not create, or objects elsewhere depend on it (%s), "+
			"and nothing was dropped; choose another --schema", ErrNotScratch, schema, pgDetail(pgErr))
	case errors.Is(err, sqlq.ErrDependents):
		return fmt.Errorf("%w: %q: %v; nothing was dropped", ErrNotScratch, schema, err)
	case err != nil:
		return err
	}
	return tx.Commit(ctx)
}

// pgDetail is a dependency error's message with its detail, which names
// the objects (a line each), on one line.
func pgDetail(e *pgconn.PgError) string {
	if e.Detail == "" {
		return e.Message
	}
	return e.Message + ": " + strings.ReplaceAll(e.Detail, "\n", "; ")
}

// resetRefusal is what dropReset would refuse after the prompt, looked at
// before it (in a transaction rolled back, no table locked): what was
// added to gendurable's own objects (refuseAdded; Prepare has run
// keepForeign already).
func resetRefusal(ctx context.Context, on beginner, schema, owner string) error {
	tx, err := on.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	return refuseAdded(ctx, tx, schema, owner)
}

// refuseAdded refuses with ErrNotScratch a reset of a schema holding
// gendurable's objects with something added to or changed in them — a
// trigger, a policy, an index, a foreign key, a grant, a sequence owned by
// a column, statistics, the schema's membership of a publication, default
// privileges in it (additions: what a schema migrated to the same version
// does not have). The reset's drop
// would take them along without a word: a probe's trigger, policy, foreign
// key and publication went with a --reset-schema --yes. Named, up to five;
// no flag suggested.
func refuseAdded(ctx context.Context, tx pgx.Tx, schema, owner string) error {
	added, err := additions(ctx, tx, schema)
	if err != nil || len(added) == 0 {
		return err
	}
	return fmt.Errorf("%w: %q holds what a schema migrated to the same version does not (someone added or changed it, "+
		"or an older gendurable built it otherwise): %s, "+
		"and nothing was changed: gendurable %s resets only a schema holding gendurable's objects as its migrations build them, "+
		"even when asked to reset it; choose another --schema", ErrNotScratch, schema, listAdded(added), owner)
}

// listAdded is at most five of additions' lines, and how many more.
func listAdded(added []string) string {
	more := ""
	if len(added) > 5 {
		more = fmt.Sprintf(" and %d more", len(added)-5)
		added = added[:5]
	}
	return strings.Join(added, "; ") + more
}

// keepForeign refuses with ErrNotScratch, whatever the flags say, a schema
// that no reset may drop: the database's public schema (a recreated one
// would not get back its owner and privileges), and one holding objects
// that are not gendurable's (sqlq.ForeignObjects: someone's tables, views,
// functions…), which it names. Its message does not suggest --reset-schema.
func keepForeign(ctx context.Context, db sqlq.RowQuerier, schema string, o Options) error {
	remedy, even := o.ForeignRemedy, ""
	switch {
	case o.Remedy == "": // demo's and bench's: they have --reset-schema and --schema
		even = ", even when asked to reset it"
		if remedy == "" {
			remedy = "nothing was changed: choose another --schema"
		}
	case remedy == "":
		remedy = "nothing was changed"
	}
	if schema == "public" {
		return fmt.Errorf("%w: %q is the database's default schema, which gendurable %s never drops "+
			"(its owner and privileges would not come back)%s; %s", ErrNotScratch, schema, o.Owner, even, remedy)
	}
	n, names, err := sqlq.ForeignObjects(ctx, db, schema, 5)
	if err != nil {
		return fmt.Errorf("inspect schema %q: %w", schema, err)
	}
	if n == 0 {
		return nil
	}
	more := ""
	if n > int64(len(names)) {
		more = fmt.Sprintf(" and %d more", n-int64(len(names)))
	}
	return fmt.Errorf("%w: %q holds %s that gendurable did not create (%s%s): gendurable %s drops "+
		"only a schema that is empty or holds gendurable's objects alone%s; %s",
		ErrNotScratch, schema, plural(n, "an object", "objects"), strings.Join(names, ", "), more, o.Owner, even, remedy)
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// refuseHeld is errInUse if a run holds schema's use (Use), else takes
// that lock exclusively for tx, until it ends (sqlq.ScratchHeld).
func refuseHeld(ctx context.Context, tx pgx.Tx, schema string) error {
	held, err := sqlq.ScratchHeld(ctx, tx, schema)
	if err != nil {
		return err
	}
	if held {
		return fmt.Errorf("%w: %q: a gendurable demo, bench or quickstart worker is running in it, and nothing was dropped: "+
			"wait for it to end, or use another schema", errInUse, schema)
	}
	return nil
}

// beginner begins a transaction: the pool, or a Hold's connection.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Hold is a run's use of its schema (Use): while it is held, Prepare and
// Drop in any other process refuse to drop the schema (ErrBusy), without
// taking a lock on its tables. The lock lives in a connection of its own
// (not one of the pool's): it ends with Release, with the process, or with
// that connection — a server restart or an idle_session_timeout ends it
// without a word, and from then on a drop is not stopped by it. Behind a
// pooler in transaction mode it holds nothing reliably (each statement may
// reach another server session), and a session lock the pooler keeps on a
// server connection after Release can refuse drops until that connection
// ends: point the demo at PostgreSQL itself.
type Hold struct {
	conn   *pgx.Conn
	schema string
}

// Use takes schema's use for this process until Release: ErrBusy if
// another run's drop of it is under way.
func Use(ctx context.Context, db *pgxpool.Pool, schema string) (*Hold, error) {
	conn, err := pgx.ConnectConfig(ctx, db.Config().ConnConfig.Copy())
	if err != nil {
		return nil, err
	}
	ok, err := sqlq.HoldScratch(ctx, conn, schema)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %q: another run is dropping it to start afresh; try again", ErrBusy, schema)
	}
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return &Hold{conn: conn, schema: schema}, nil
}

// or is where a drop under h runs: h's connection, whose own lock does not
// stop the drop, or db without a Hold.
func (h *Hold) or(db *pgxpool.Pool) beginner {
	if h == nil || h.conn == nil {
		return db
	}
	return h.conn
}

// Release ends the use (closing its connection). A nil Hold, or one
// released already, is a no-op.
func (h *Hold) Release() {
	if h == nil || h.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Let go first: closing the connection ends the session and its lock,
	// unless a pooler keeps the server session.
	_ = sqlq.UnholdScratch(ctx, h.conn, h.schema)
	_ = h.conn.Close(ctx)
	h.conn = nil
}

// additions lists what schema holds beyond a schema migrated to the same
// version, built for the comparison inside tx and rolled back
// (sqlq.SchemaShape: a column, an index, a constraint, a trigger, a policy,
// a grant, a comment, a default, an enum label, statistics, a publication,
// a function's source…); the caller has locked every table of schema
// (sqlq.ForeignRows) so that nothing changes until the drop. DROP … RESTRICT drops all of those with
// gendurable's objects without a word, so dropOwn must refuse them itself.
// A schema of a newer gendurable is left to migrate.Down, which refuses it.
func additions(ctx context.Context, tx pgx.Tx, schema string) ([]string, error) {
	v, err := sqlq.InstalledVersion(ctx, tx, schema)
	if err != nil {
		return nil, err
	}
	if v > migrate.Latest() {
		return nil, nil // a newer gendurable's: migrate.Down refuses it, saying so
	}
	// dropOwn's ForeignRows has locked every table of the schema: nothing
	// changes what they are made of between this look and the drop (an
	// ALTER TABLE committed meanwhile was dropped before).
	have, err := sqlq.SchemaShape(ctx, tx, schema)
	if err != nil {
		return nil, err
	}
	sp, err := tx.Begin(ctx) // a savepoint: the reference is rolled back
	if err != nil {
		return nil, err
	}
	defer func() { _ = sp.Rollback(ctx) }()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	ref := fmt.Sprintf("gendurable_shape_%x", b)
	if err := sqlq.CreateScratchSchema(ctx, sp, ref, "shape"); err != nil {
		return nil, fmt.Errorf("reference schema: %w", err)
	}
	if v > 0 {
		if _, err := migrate.To(ctx, sp, ref, v); err != nil {
			return nil, fmt.Errorf("reference schema at version %d: %w", v, err)
		}
	}
	want, err := sqlq.SchemaShape(ctx, sp, ref)
	if err != nil {
		return nil, err
	}
	slices.Sort(want) // the database's collation may order them otherwise
	var added []string
	for _, line := range have {
		if _, found := slices.BinarySearch(want, line); !found {
			added = append(added, line)
		}
	}
	return added, nil
}

func describe(info sqlq.SchemaInfo) string {
	switch {
	case info.Gendurable:
		return fmt.Sprintf("holds gendurable's tables (%d objects in all)", info.Objects)
	case info.Objects == 1:
		return "holds 1 object"
	case info.Objects > 0:
		return fmt.Sprintf("holds %d objects", info.Objects)
	}
	return "exists (empty)"
}
