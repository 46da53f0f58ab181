// Package sqlq is the one home of gendurable's SQL: every statement the engine
// runs is a named constant or function here, beside its siblings, so the cost
// model of docs/design.md §4 maps one to one onto code.
//
// Statements are written against the placeholder {{schema}}, which New
// replaces once with the validated, quoted schema name. Every value is passed
// as a parameter; nothing a caller supplies is ever spliced into SQL text.
package sqlq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what every statement runs on: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrInvalidSchema is returned for a schema name that is not a plain identifier.
var ErrInvalidSchema = errors.New("invalid schema name")

var schemaRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateSchema accepts a plain SQL identifier of at most 63 bytes: a letter
// or underscore followed by letters, digits and underscores. Anything else is
// rejected rather than escaped, so a schema name can never carry SQL. The
// system's schemas are refused too: information_schema (tables created there
// are left out of a default pg_dump, so out of backups) and every name
// PostgreSQL reserves (pg_…: pg_catalog, pg_toast, pg_temp).
func ValidateSchema(name string) error {
	if name == "" || len(name) > 63 || !schemaRE.MatchString(name) {
		return fmt.Errorf("%w: %q (want 1-63 characters of [A-Za-z0-9_], not starting with a digit)", ErrInvalidSchema, name)
	}
	if name == "information_schema" || strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("%w: %q is a system schema (information_schema, pg_…): use a schema of your own", ErrInvalidSchema, name)
	}
	return nil
}

// quoteIdent quotes an identifier that ValidateSchema accepted.
func quoteIdent(name string) string { return `"` + name + `"` }

// render substitutes the quoted schema into a statement template.
func render(tmpl, quotedSchema string) string {
	return strings.ReplaceAll(tmpl, "{{schema}}", quotedSchema)
}

// Queries holds every statement rendered for one schema.
type Queries struct {
	Schema string // unquoted, validated

	pick            string
	pickFloorCheck  string
	heartbeat       string
	clearUnstarted  string
	claimInput      string
	reap            string
	applyOutcomes   [shapeCount]namedStmt
	release         string
	releaseUnknown  string
	oversizedClaims string
	insertMany      string
	insertPlain     string
	insertSlot      string
	lookupUnique    string
	getInstance     string
	instancesOf     string
	signal          string
	signalDup       string
	wakeTimedOut    string
	waitInfo        string
	retry           string
	listScan        string
	listSearch      string
	queueCounts     string
	setPaused       string
	removeQueue     string
	cancel          string
	prune           string
	pruneLock       string
	pruneBuckets    string
	clearLeases     string
	listSignals     string
	insertSpan      string
	listAllChildren string
	stepCounts      string
	throughput      string
	retryMany       string
	cancelMany      string
	sweepInboxes    string
	lockedOutcomes  string
	recoverOutcomes string
	retryLock       string
	reawaitLock     string
	reawait         string
	existing        string
	parentsAmong    string
	treeChildren    string
	runNow          string
	upsertMachines  string
	mergeObserved   string
	storedMachines  string
	uniqueHolder    string
}

// New validates the schema name and renders every statement for it.
func New(schema string) (*Queries, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	qs := quoteIdent(schema)
	q := &Queries{
		Schema:          schema,
		pick:            render(pickSQL, qs),
		pickFloorCheck:  render(pickFloorCheckSQL, qs),
		heartbeat:       render(heartbeatSQL, qs),
		clearUnstarted:  render(clearUnstartedSQL, qs),
		claimInput:      render(claimInputSQL, qs),
		reap:            render(reapSQL, qs),
		release:         render(releaseSQL, qs),
		releaseUnknown:  render(releaseUnknownSQL, qs),
		oversizedClaims: render(oversizedClaimsSQL, qs),
		insertMany:      render(insertManySQL, qs),
		insertPlain:     render(insertPlainSQL, qs),
		insertSlot:      render(insertSlotSQL, qs),
		getInstance:     render(getInstanceSQL, qs),
		instancesOf:     render(instancesOfSQL, qs),
		lookupUnique:    render(lookupUniqueSQL, qs),
		signal:          render(signalSQL, qs),
		signalDup:       render(signalDupSQL, qs),
		wakeTimedOut:    render(wakeTimedOutSQL, qs),
		waitInfo:        render(waitInfoSQL, qs),
		retry:           render(retrySQL, qs),
		listScan:        render(listScanSQL, qs),
		listSearch:      render(listSearchSQL, qs),
		queueCounts:     render(queueCountsSQL, qs),
		setPaused:       render(setPausedSQL, qs),
		removeQueue:     render(removeQueueSQL, qs),
		cancel:          render(cancelSQL, qs),
		prune:           render(pruneSQL, qs),
		pruneLock:       render(pruneLockSQL, qs),
		pruneBuckets:    render(pruneBucketsSQL, qs),
		clearLeases:     render(clearLeasesSQL, qs),
		listSignals:     render(listSignalsSQL, qs),
		insertSpan:      render(insertSpanSQL, qs),
		listAllChildren: render(listAllChildrenSQL, qs),
		stepCounts:      render(stepCountsSQL, qs),
		throughput:      render(throughputSQL, qs),
		retryMany:       render(retryManySQL, qs),
		cancelMany:      render(cancelManySQL, qs),
		sweepInboxes:    render(sweepInboxesSQL, qs),
		lockedOutcomes:  render(lockedOutcomesSQL, qs),
		recoverOutcomes: render(recoverOutcomesSQL, qs),
		retryLock:       render(retryLockSQL, qs),
		reawaitLock:     render(reawaitLockSQL, qs),
		reawait:         render(reawaitSQL, qs),
		existing:        render(existingSQL, qs),
		parentsAmong:    render(parentsAmongSQL, qs),
		treeChildren:    render(treeChildrenSQL, qs),
		runNow:          render(runNowSQL, qs),
		upsertMachines:  render(upsertMachinesSQL, qs),
		mergeObserved:   render(mergeObservedSQL, qs),
		storedMachines:  render(storedMachinesSQL, qs),
		uniqueHolder:    render(uniqueHolderSQL, qs),
	}
	for sh := range outcomeShape(shapeCount) {
		q.applyOutcomes[sh] = bindNamed(render(outcomeSQL(sh), qs))
	}
	return q, nil
}

// micros converts a duration to whole microseconds for `$n * interval '1 microsecond'`.
func micros(d interface{ Microseconds() int64 }) int64 { return d.Microseconds() }

// Rejected reports an error that the same statement with the same values
// would meet again, so retrying it is pointless: a data exception (class
// 22, e.g. a JSON string holding \u0000) or a program limit exceeded
// (class 54, e.g. "stack depth limit exceeded" parsing a deeply nested
// jsonb document).
func Rejected(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "54"))
}

// LockTimedOut reports a statement that gave up waiting for a lock
// (SQLSTATE 55P03: its lock_timeout ran out, see OutcomeBatch.LockWait):
// nothing of it was written.
func LockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// Deadlocked reports a transaction PostgreSQL ended with nothing changed
// because it deadlocked with another (SQLSTATE 40P01) or could not be
// serialized beside it (40001): the same work, tried again, may succeed.
func Deadlocked(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// CatalogRace reports PostgreSQL's internal error for a catalog entry that
// a statement's snapshot still lists but that a concurrent transaction has
// just dropped (XX000 "cache lookup failed for …"): a function that reads
// the catalog's cache (pg_identify_object, a DDL statement's lookups) met
// it gone. Nothing the statement's transaction did caused it, and the same
// work, tried again, sees the catalog as it is.
func CatalogRace(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "XX000" && strings.HasPrefix(pgErr.Message, "cache lookup failed")
}

// PreparedStatementClash reports an error a connection pooler in
// transaction mode gives pgx's default named prepared statements: a name
// unknown (26000) or already taken (42P05) on the server session the
// pooler handed this transaction. Or one it gives pgx's describe_exec
// mode, whose describe and execute are two round trips that the pooler
// may hand to different server sessions: the execute's bind then meets
// another client's unnamed statement, or none — "bind message supplies 2
// parameters, but prepared statement "" requires 3", "bind message has 1
// result formats but query has 2 columns" (08P01), "unnamed prepared
// statement does not exist" (26000). A probe saw Start fail with the first
// without the advice, and picks log it without end.
func PreparedStatementClash(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "26000", "42P05":
		return strings.Contains(pgErr.Message, "prepared statement")
	case "08P01":
		return strings.HasPrefix(pgErr.Message, "bind message ") &&
			(strings.Contains(pgErr.Message, `prepared statement ""`) || strings.Contains(pgErr.Message, "result formats but query has"))
	}
	return false
}

// StatementPooling reports the error PgBouncer in statement pooling mode
// ends a session with once it is in a transaction block: FATAL, protocol
// violation (08P01), "transaction blocks not allowed in statement pooling
// mode".
func StatementPooling(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "08P01" && strings.Contains(pgErr.Message, "statement pooling")
}

// StatementPoolingHint is the advice for StatementPooling.
const StatementPoolingHint = "PgBouncer in statement pooling runs no transaction blocks, which outcomes need: " +
	"use pool_mode = transaction (README, \"Behind PgBouncer\")"

// PoolerHint is the advice for a PreparedStatementClash.
const PoolerHint = "behind PgBouncer in transaction pooling? use default_query_exec_mode=cache_describe " +
	"(pgx.QueryExecModeCacheDescribe): README, \"Behind PgBouncer\""

// ErrAttrs are the log attributes of a failed statement's error: "err",
// and "advice" when a connection pooler caused it (PoolerAdvice) — an
// engine started behind a pooler that later clashes says why in every line.
func ErrAttrs(err error) []any {
	if advice := PoolerAdvice(err); advice != "" {
		return []any{"err", err, "advice", advice}
	}
	if ObjectMissing(err) {
		return []any{"err", err, "advice", SchemaChangedHint}
	}
	return []any{"err", err}
}

// SchemaChangedHint is ErrAttrs's advice for a statement that found one of
// gendurable's tables, columns or functions missing: most likely the schema
// was migrated under a running engine (an upgrade probe: an engine left
// running after a `migrate down` logged the bare "column … does not
// exist" on every pick).
const SchemaChangedHint = "gendurable's tables may have changed under this running engine, migrated to another " +
	"version or removed (gendurable migrate status says which version the schema is at): run engines of the schema's version"

// ObjectMissing reports an undefined table, column or function (42P01,
// 42703, 42883).
func ObjectMissing(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703" || pgErr.Code == "42883")
}

// PoolerAdvice is the advice for an error a connection pooler caused
// (PreparedStatementClash, StatementPooling), or "".
func PoolerAdvice(err error) string {
	switch {
	case PreparedStatementClash(err):
		return PoolerHint
	case StatementPooling(err):
		return StatementPoolingHint
	}
	return ""
}

// NotCommitted reports an error after which an autocommit statement surely
// did not commit: the server refused it, or it was never sent. Any other
// (a context's end, a connection lost mid-statement) leaves it unknown.
func NotCommitted(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || pgconn.SafeToRetry(err)
}

// Severity is pgErr's severity in English (ERROR, FATAL, PANIC, …): its
// Severity field is translated under the server's lc_messages ("FEHLER",
// "PANIK"), SeverityUnlocalized (PostgreSQL 9.6 on) is not.
func Severity(pgErr *pgconn.PgError) string {
	if pgErr.SeverityUnlocalized != "" {
		return pgErr.SeverityUnlocalized
	}
	return pgErr.Severity
}

// ConnectionRefusal reports an error answer of the server (or a proxy on
// the way) about the connection rather than the statement: SQLSTATE class
// 08 (PgBouncer's refused login, …), or the server shutting down or
// starting up (57P01, 57P02, 57P03). Unlike ConnectionFailure, not a
// network error: there the answer was lost, and a statement may have
// committed. A pooler's prepared-statement clash of pgx's describe_exec
// mode (PreparedStatementClash: "bind message supplies …", 08P01) is not
// one: the server refused the statement on a connection that is fine (a
// PgBouncer probe: the CLI called it connection_lost, "may or may not have
// been committed", and WaitResult would have polled on without end).
func ConnectionRefusal(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "08") || slices.Contains([]string{"57P01", "57P02", "57P03"}, pgErr.Code)) &&
		!PreparedStatementClash(err)
}

// ConnectionFailure reports an error that says the connection or the
// server failed rather than the statement: the connection was lost or could
// not be made (SQLSTATE class 08, a network error, EOF), the server is
// shutting down or starting up (57P01, 57P02, 57P03), or it has no
// connection to give (53300). A context's deadline or cancellation is not
// one: it is the caller's. Nor is a bare syscall.Errno outside a
// *net.OpError — a file's (*fs.PathError: a stat or a mkdir of the demo's
// throwaway server), a rename's, a kill's — though an Errno is a net.Error:
// the demo's missing server binaries read as a connection lost
// mid-command, with advice about what it may have committed (a
// newcomer's probe). Nor is a failed listen.
func ConnectionFailure(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return ConnectionRefusal(err) || pgErr.Code == "53300"
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		// A listen of this process's own (gendurable ui's --addr) is not a
		// connection to the database (a hostile probe: a port in use read
		// as a connection lost mid-command).
		return opErr.Op != "listen"
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		_, bare := netErr.(syscall.Errno)
		return !bare
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}
