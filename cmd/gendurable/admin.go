package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/benchrun"
	"github.com/gendurable/gendurable/internal/demo"
	"github.com/gendurable/gendurable/internal/display"
	"github.com/gendurable/gendurable/internal/scratch"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// common holds the flags every database command takes.
type common struct {
	dbURL  string
	schema string
	json   bool
	// ui: the engine serves the dashboard, whose users act through it (its
	// lines say via=ui; the dashboard's audit lines name the user).
	ui bool
}

func (c *common) register(fs *flag.FlagSet) {
	databaseURLFlag(fs, &c.dbURL, "PostgreSQL `URL` (default DATABASE_URL, else the local server)")
	c.schema = "public"
	fs.Var(schemaFlag(&c.schema), "schema", "the `name` of the schema holding gendurable's tables (not empty)")
	fs.BoolVar(&c.json, "json", false, "print JSON")
}

// errEmptySchema: --schema was given an empty value. The library reads an
// empty Config.Schema as "public", so without this check an unset shell
// variable (--schema "$SCHEMA") would act on the public schema.
var errEmptySchema = errors.New(`empty: give the schema's name (omit --schema for the default: "public", or demo's and bench's own)`)

// errEmptyDatabaseURL: --database-url was given an empty value. Read as
// unset it would fall through to DATABASE_URL or the local server: a
// `--database-url "$TARGET"` with TARGET unset would act on another
// database than the one meant.
var errEmptyDatabaseURL = errors.New(`empty: give the database's URL (omit --database-url for DATABASE_URL, else the default)`)

// nonEmptyFlag is a string flag whose value, empty or only white space, is
// the usage error empty when the command line is parsed, before any
// connection: --schema (any other bad name is the library's
// ErrInvalidSchema, also before one) and --database-url.
type nonEmptyFlag struct {
	s     *string
	empty error
}

func (f nonEmptyFlag) String() string {
	if f.s == nil {
		return ""
	}
	return *f.s
}

func (f nonEmptyFlag) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return f.empty
	}
	*f.s = v
	return nil
}

// schemaFlag is --schema (see nonEmptyFlag).
func schemaFlag(p *string) flag.Value { return nonEmptyFlag{p, errEmptySchema} }

// databaseURLFlag defines --database-url on fs (see nonEmptyFlag).
func databaseURLFlag(fs *flag.FlagSet, p *string, usage string) {
	fs.Var(nonEmptyFlag{p, errEmptyDatabaseURL}, "database-url", usage)
}

// engine opens a pool and an insert-only engine for admin calls. Its
// Logger writes the library's audit lines of mutations (retries, cancels,
// queue changes, ...) to stderr, as text or, with --json, JSON lines, with
// via=cli and the operating-system user. done closes the pool.
func (c *common) engine(ctx context.Context, stderr io.Writer) (*gendurable.Engine, func(), error) {
	eng, pool, err := c.engineAndPool(ctx, stderr)
	if err != nil {
		return nil, nil, err
	}
	return eng, func() { closePool(pool) }, nil
}

// closePool closes pool, waiting for it at most poolCloseWait. pgxpool's
// Close waits for each connection's close, and one whose statement a
// cancel cut short is drained first, for up to 15 s: behind a paused
// PgBouncer, a command interrupted with Ctrl-C took 15 s more to exit,
// and Ctrl-C again did nothing (a PgBouncer probe). Exiting closes the
// sockets all the same.
func closePool(pool *pgxpool.Pool) {
	done := make(chan struct{})
	go func() {
		pool.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(poolCloseWait):
	}
}

// poolCloseWait bounds closePool.
const poolCloseWait = time.Second

// engineAndPool is engine, with the pool it opened (the caller closes it).
func (c *common) engineAndPool(ctx context.Context, stderr io.Writer) (*gendurable.Engine, *pgxpool.Pool, error) {
	eng, pool, err := c.uncheckedEngine(ctx, stderr)
	if err != nil {
		return nil, nil, err
	}
	if _, err := sameVersion(ctx, pool, c.schema); err != nil {
		closePool(pool)
		return nil, nil, err
	}
	return eng, pool, nil
}

// uncheckedEngine is engineAndPool without the schema's version check, and
// so without a connection yet: for ui, which checks the rest of its input
// first.
func (c *common) uncheckedEngine(ctx context.Context, stderr io.Writer) (*gendurable.Engine, *pgxpool.Pool, error) {
	url, err := databaseURL(c.dbURL)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := parseDatabaseURL(url)
	if err != nil {
		return nil, nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: c.schema, Logger: c.logger(stderr)})
	if err != nil {
		closePool(pool)
		return nil, nil, err
	}
	return eng, pool, nil
}

// newerSchema is the error for a schema at version v, newer than this
// binary's (JSON code schema_version).
func newerSchema(schema string, v int) error {
	return fmt.Errorf("%w (%w): schema %q is at version %d, newer than this binary's %d: upgrade this gendurable",
		migrate.ErrSchemaVersion, migrate.ErrSchemaUnknown, schema, v, migrate.Latest())
}

// sameVersion refuses a schema migrated to another version than this
// binary's, before a command reads or changes it: an older binary's cancel,
// retry or prune against a newer schema would write rows by rules the
// newer version may have changed, and its counts and lists may misread it
// (code schema_version if newer, not_migrated if older). A schema with no
// gendurable tables is left to the command (ErrNotMigrated, naming the
// fix). It returns the version it read: 0 for such a schema, -1 when the
// read failed with an error it leaves to the command's own statements.
func sameVersion(ctx context.Context, pool *pgxpool.Pool, schema string) (int, error) {
	v, err := migrate.Installed(ctx, pool, schema)
	switch {
	case err != nil && (errors.Is(err, gendurable.ErrSchemaVersion) || errors.Is(err, migrate.ErrDependents)):
		return -1, err
	case err != nil && (errors.As(err, new(*pgconn.ConnectError)) || ctx.Err() != nil):
		// No connection: the command's own statements would only connect
		// again, and time out again (a newcomer probe waited two connect
		// timeouts for one unanswering server).
		return -1, err
	case err != nil:
		return -1, nil // the command's own statements report a database error
	case v == 0, v == migrate.Latest():
		return v, nil // a missing schema is the command's to report
	case v > migrate.Latest():
		return v, newerSchema(schema, v)
	}
	return v, fmt.Errorf("%w: schema %q is at version %d, this library needs %d; run `gendurable migrate up --schema %s`",
		gendurable.ErrSchemaVersion, schema, v, migrate.Latest(), schema)
}

// checkConnection pings the database through pool, so that a command that
// would otherwise start without touching it (ui) fails at once, saying
// why, when the URL is wrong or the server is down, rather than serving
// pages that all fail. The connection it opens stays in the pool for the
// command's work. The connect timeout bounds it (parseDatabaseURL's
// pgurl.DefaultConnectTimeout, or the URL's connect_timeout), not a deadline of
// its own: at a deadline the pool's Acquire returns only "context deadline
// exceeded", where a connect that times out says which server and database
// it could not reach.
func checkConnection(ctx context.Context, pool *pgxpool.Pool) error {
	return pool.Ping(ctx)
}

// logger is the CLI's audit logger (see engine). Under ui the actions are
// the dashboard users': its lines say via=ui and name the server's
// operating-system user as such, not as the one who acted.
func (c *common) logger(stderr io.Writer) *slog.Logger {
	if c.ui {
		h, name := logHandler(stderr, c.json)
		return slog.New(h).With("via", "ui", "server_user", name)
	}
	return cliLogger(stderr, c.json)
}

// cliLogger is the audit logger of a command run from the shell: text
// lines on stderr (JSON lines if asJSON), with via=cli and the
// operating-system user. Every mutation leaves a line on it: those of the
// admin commands (through the engine), migrate's, and a --reset-schema drop.
func cliLogger(stderr io.Writer, asJSON bool) *slog.Logger {
	h, name := logHandler(stderr, asJSON)
	return slog.New(h).With("via", "cli", "user", name)
}

// logHandler is the handler of the CLI's log lines: text, whose values
// slog quotes with every control and bidirectional character escaped, or
// JSON lines, which slog writes with DEL, C1 and bidirectional controls as
// they are (a cancel reason or a dashboard user's input can carry them):
// those go through display.InertJSON, as --json output does.
func logHandler(stderr io.Writer, asJSON bool) (slog.Handler, string) {
	var h slog.Handler = slog.NewTextHandler(stderr, nil)
	if asJSON {
		h = slog.NewJSONHandler(inertWriter{stderr}, nil)
	}
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	return h, name
}

// inertWriter writes JSON text through display.InertJSON. slog's JSON handler
// writes each record in one Write.
type inertWriter struct{ w io.Writer }

func (w inertWriter) Write(p []byte) (int, error) {
	if _, err := w.w.Write(display.InertJSON(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// parse parses flags that may come before or after the positional
// arguments, and checks the number of positional arguments.
func parse(fs *flag.FlagSet, args []string, positional ...string) ([]string, error) {
	pos, err := parseAll(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != len(positional) {
		what := "no arguments"
		if len(positional) > 0 {
			what = strings.Join(positional, " ")
		}
		return nil, usageError{msg: fmt.Sprintf("%s takes %s, got %d argument(s)", fs.Name(), what, len(pos)), help: true}
	}
	return pos, nil
}

// parseAll parses flags that may come before or after positional
// arguments and returns the positional ones. "--" ends the flags: every
// argument after it is positional, however it looks — `cancel -- 7 --tree
// --yes` is three ids (and refused), not a tree cancel of 7, and `signal --
// 7 -pay` sends a signal named "-pay".
func parseAll(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if endedFlags(fs, args[:len(args)-len(rest)]) {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// endedFlags reports whether the flag package, having consumed the
// arguments consumed (flags and their values), stopped at a "--" that ends
// the flags, rather than at a positional argument: a "--" that is the
// value of a flag before it (--reason --) ends nothing.
func endedFlags(fs *flag.FlagSet, consumed []string) bool {
	for i := 0; i < len(consumed); i++ {
		a := consumed[i]
		if a == "--" {
			return true
		}
		if valueNext(fs, a) != "" {
			i++ // its value is the next argument, whatever it looks like
		}
	}
	return false
}

// valueNext is the name of the flag a names if that flag takes its value
// from the next argument (a is -name or --name, without =value, of a flag
// of fs that is not a bool flag); else "".
func valueNext(fs *flag.FlagSet, a string) string {
	name, _, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
	f := fs.Lookup(name)
	if hasValue || f == nil {
		return ""
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return ""
	}
	return name
}

// withInstance is the preamble of a command on one instance: it parses args
// (the instance's ID, then the positional arguments more names), runs check
// if given (flag values, before the database is opened), opens the engine
// and runs fn with the id and the arguments after it.
func (c *common) withInstance(ctx context.Context, fs *flag.FlagSet, args []string, stderr io.Writer, more []string,
	check func(rest []string) error, fn func(eng *gendurable.Engine, id int64, rest []string) error) error {
	pos, err := parse(fs, args, append([]string{"ID"}, more...)...)
	if err != nil {
		return err
	}
	id, err := parseID(pos[0])
	if err != nil {
		return err
	}
	if check != nil {
		if err := check(pos[1:]); err != nil {
			return err
		}
	}
	eng, done, err := c.engine(ctx, stderr)
	if err != nil {
		return err
	}
	defer done()
	return fn(eng, id, pos[1:])
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 || s[0] < '0' || s[0] > '9' { // "+4" parses too
		return 0, usageError{msg: fmt.Sprintf("%q is not an instance id", s), help: true}
	}
	return id, nil
}

// filterFlags are list's filters, shared by list and the bulk retry and
// cancel.
type filterFlags struct {
	f      gendurable.ListFilter
	status string
	since  time.Duration
}

func (ff *filterFlags) register(fs *flag.FlagSet) {
	fs.Var(&filterText{s: &ff.f.Queue}, "queue", "only this `queue`")
	fs.Var(&filterText{s: &ff.status}, "status", "only this `status` (runnable, executing, awaiting_signal, awaiting_children, done, failed)")
	fs.Var(&filterText{s: &ff.f.Machine}, "machine", "only this `machine`")
	fs.Var(&filterText{s: &ff.f.Step}, "step", "only instances at this `step`")
	fs.Var(&filterText{s: &ff.f.Search}, "search", "only the instance whose id, partition key or unique key is this exact `text` (index lookups)")
	fs.Var(&sinceFlag{d: &ff.since}, "since", "only instances inserted within this `duration` (e.g. 30m, 2h)")
	fs.IntVar(&ff.f.MaxScan, "scan", gendurable.DefaultListScan, fmt.Sprintf("look at no more than this many instances per statement (at most %d)", gendurable.MaxListScan))
}

// errEmptyFilter: a filter flag was given an empty value. Read as "not
// given", an unset shell variable (--queue "$QUEUE") would widen a bulk
// cancel or retry to every queue.
var errEmptyFilter = errors.New("empty: give a value, or leave the flag out")

// errFilterTwice: a filter flag was given twice; neither value is taken
// over the other.
var errFilterTwice = errors.New("given twice: give each filter once")

// filterText is a text filter flag (--queue, --status, --machine, --step,
// --search), or another flag held to the same rule (signal's --payload and
// --dedup-key: an unset variable in a script would send another signal):
// an empty value, or one given twice, is a usage error when the
// command line is parsed, before any connection. (White space around a
// name is the library's ErrInvalidInput, also before one.)
type filterText struct {
	s   *string
	set bool
	// twice, if set, replaces errFilterTwice (a flag that is no filter).
	twice error
}

func (*filterText) refusesTwice() {}

func (f *filterText) String() string {
	if f == nil || f.s == nil {
		return ""
	}
	return *f.s
}

func (f *filterText) Set(v string) error {
	switch {
	case f.set && f.twice != nil:
		return f.twice
	case f.set:
		return errFilterTwice
	case v == "":
		return errEmptyFilter
	}
	*f.s, f.set = v, true
	return nil
}

// errGivenTwice: a flag that is no filter (signal's --payload,
// --dedup-key) was given twice; the second would have won.
var errGivenTwice = errors.New("given twice: give it once")

// sinceFlag is --since: a duration above zero, given once (zero, read as
// "not given", would widen a bulk action as an empty filter would).
type sinceFlag struct {
	d   *time.Duration
	set bool
}

func (*sinceFlag) refusesTwice() {}

func (f *sinceFlag) String() string {
	if f == nil || f.d == nil || *f.d == 0 {
		return "0s"
	}
	return f.d.String()
}

func (f *sinceFlag) Set(v string) error {
	if f.set {
		return errFilterTwice
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return errors.New("want a duration such as 30s, 5m or 2h")
	case d <= 0:
		return fmt.Errorf("%s is not above zero", v)
	}
	*f.d, f.set = d, true
	return nil
}

// filter checks the flags and returns the filter they describe.
func (ff *filterFlags) filter(cmd string) (gendurable.ListFilter, error) {
	f := ff.f
	f.Status = gendurable.Status(ff.status)
	switch {
	case ff.status != "" && !slices.Contains(statuses, f.Status):
		return f, usageError{msg: fmt.Sprintf("%s: --status %q is not a status (want one of %s)", cmd, ff.status, statusList()), help: true}
	case f.MaxScan < 1 || f.MaxScan > gendurable.MaxListScan:
		return f, usageError{msg: fmt.Sprintf("%s: --scan must be within 1..%d", cmd, gendurable.MaxListScan), help: true}
	}
	if ff.since > 0 {
		f.From = time.Now().Add(-ff.since)
	}
	return f, nil
}

var statuses = []gendurable.Status{gendurable.StatusRunnable, gendurable.StatusExecuting, gendurable.StatusAwaitingSignal,
	gendurable.StatusAwaitingChildren, gendurable.StatusDone, gendurable.StatusFailed}

func statusList() string {
	s := make([]string, len(statuses))
	for i, st := range statuses {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

func statusCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status")
	var c common
	c.register(fs)
	if _, err := parse(fs, args); err != nil {
		return err
	}
	eng, done, err := c.engine(ctx, stderr)
	if err != nil {
		return err
	}
	defer done()
	qs, err := eng.Queues(ctx)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(stdout, qs)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "queue\tpaused\trunnable\texecuting\tawaiting_signal\tawaiting_children\tdone\tfailed\ttotal\t")
	for _, q := range qs {
		b := q.ByStatus
		fmt.Fprintf(tw, "%s\t%v\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", display.Terminal(q.Queue), q.Paused, b[gendurable.StatusRunnable], b[gendurable.StatusExecuting],
			b[gendurable.StatusAwaitingSignal], b[gendurable.StatusAwaitingChildren], b[gendurable.StatusDone], b[gendurable.StatusFailed], q.Total)
	}
	return tw.Flush()
}

func listCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("list")
	var c common
	c.register(fs)
	var ff filterFlags
	ff.register(fs)
	limit := fs.Int("limit", 50, fmt.Sprintf("rows (at most %d)", gendurable.MaxListLimit))
	before := fs.Int64("before", 0, "page: only ids below this (the previous page's next_before)")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	f, err := ff.filter("list")
	if err != nil {
		return err
	}
	switch {
	case *limit < 1 || *limit > gendurable.MaxListLimit:
		return usageError{msg: fmt.Sprintf("list: --limit must be within 1..%d", gendurable.MaxListLimit), help: true}
	case *before < 0:
		return usageError{msg: "list: --before must not be negative", help: true}
	case *before == 0 && flagGiven(fs, "before"):
		// Read as no cursor, it listed the first page again: a script
		// paging with an unset variable would loop on it (a probe).
		return usageError{msg: "list: --before must be an id above 0 (the previous page's next_before); leave it out for the first page", help: true}
	}
	f.Limit, f.Before = *limit, *before
	if err := f.Validate(); err != nil {
		// Before any connection, as the bulk commands check it: read after
		// the schema's version, a name with white space around it was exit 1
		// (cannot_connect, not_migrated) while the database was down or at
		// another version, not exit 2.
		return cliWords(err)
	}
	eng, done, err := c.engine(ctx, stderr)
	if err != nil {
		return err
	}
	defer done()
	page, err := eng.List(ctx, f)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(stdout, page)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMACHINE\tQUEUE\tSTEP\tSTATUS\tATTEMPT\tINSERTED\tLAST ERROR")
	now := time.Now()
	for _, in := range page.Instances {
		fmt.Fprintf(tw, "%d\t%s@%d\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", in.ID, display.Terminal(in.Machine), in.Version, display.Terminal(in.Queue), display.Terminal(in.Step), listStatus(in, now),
			display.Run(in.Attempt, in.MaxAttempts, in.Status), in.MaxAttempts, in.InsertedAt.Local().Format(localStamp), oneLine(in.LastError, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Partial {
		fmt.Fprintf(stdout, "looked at %d instances and stopped (raise --scan to look at more at once)\n", page.Scanned)
	}
	if page.NextBefore > 0 {
		fmt.Fprintf(stdout, "more: --before %d\n", page.NextBefore)
	}
	return nil
}

// localStamp and localTime are how text output writes a time of this
// machine's zone: named, as messages in UTC end in Z (RFC 3339).
const (
	localStamp = time.DateTime + " MST"
	localTime  = time.TimeOnly + " MST"
)

// listStatus is list's STATUS column: the status, and for a runnable
// instance not eligible yet (scheduled, or backing off before its next
// attempt) when it becomes eligible, by this machine's clock — "runnable,
// due 14:03:07 CET", with the date when it is not today.
func listStatus(in gendurable.InstanceSummary, now time.Time) string {
	s := display.Terminal(string(in.Status))
	if in.Status != gendurable.StatusRunnable || !in.EligibleAt.After(now) {
		return s
	}
	due := in.EligibleAt.Local()
	layout := localTime
	if y, m, d := due.Date(); y != now.Local().Year() || m != now.Local().Month() || d != now.Local().Day() {
		layout = localStamp
	}
	return s + ", due " + due.Format(layout)
}

func showCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("show")
	var c common
	c.register(fs)
	return c.withInstance(ctx, fs, args, stderr, nil, nil, func(eng *gendurable.Engine, id int64, _ []string) error {
		// The text shows 80 bytes of a payload and no child's result: it
		// reads at most 4 KiB of each; --json reads and prints them whole.
		o := gendurable.DescribeOptions{ValueBytes: 4096}
		if c.json {
			o = gendurable.DescribeOptions{}
		}
		d, err := eng.DescribeWith(ctx, id, o)
		if err != nil {
			return err
		}
		if c.json {
			return printJSON(stdout, d)
		}
		printInstance(stdout, d)
		return nil
	})
}

// printInstance is show's text output.
func printInstance(stdout io.Writer, d *gendurable.InstanceDetail) {
	p := display.Terminal
	fmt.Fprintf(stdout, "instance %d  %s@%d  queue %s\n", d.ID, p(d.Machine), d.Version, p(d.Queue))
	fmt.Fprintf(stdout, "status   %s at step %s (attempt %d of %d)\n", p(string(d.Status)), p(d.Step), display.Run(d.Attempt, d.MaxAttempts, d.Status), d.MaxAttempts)
	fmt.Fprintf(stdout, "waiting  %s\n", p(d.Wait.Summary))
	if d.PartitionKey != "" {
		fmt.Fprintf(stdout, "key      %s\n", p(d.PartitionKey))
	}
	if d.Parent != nil {
		fmt.Fprintf(stdout, "parent   %d (%s, %s)\n", d.Parent.ID, p(d.Parent.Machine), p(string(d.Parent.Status)))
	}
	fmt.Fprintf(stdout, "state    %s\n", p(string(d.State)))
	if len(d.Result) > 0 {
		fmt.Fprintf(stdout, "result   %s\n", p(string(d.Result)))
	}
	for _, e := range d.Errors {
		fmt.Fprintf(stdout, "error    %s step %s attempt %d [%s] %s\n", e.At.Local().Format(localStamp), p(e.Step), display.Attempt(e.Attempt), p(e.Kind), oneLine(e.Error, 200))
		printStack(stdout, e.Stack)
	}
	for _, s := range d.Signals {
		consumed := "pending"
		if s.ConsumedAt != nil {
			consumed = "consumed"
		}
		payload := oneLine(string(s.Payload), 80)
		if s.PayloadLeftOut > 0 {
			payload = fmt.Sprintf("(%d bytes; show --json prints it)", s.PayloadLeftOut)
		}
		fmt.Fprintf(stdout, "signal   %d %s %s %s\n", s.ID, p(s.Name), consumed, payload)
	}
	if d.MoreSignals {
		fmt.Fprintf(stdout, "signal   … older ones not shown (the newest %d are)\n", len(d.Signals))
	}
	for _, k := range d.Children {
		fmt.Fprintf(stdout, "child    %d %s %s\n", k.ID, p(k.Machine), p(string(k.Status)))
	}
	if d.MoreChildren {
		fmt.Fprintf(stdout, "child    … more not shown (the first %d are)\n", len(d.Children))
	}
}

// Bounds of a panic's stack trace as show prints it; show --json has the
// whole trace (the engine keeps at most 8 KiB of it).
const (
	maxStackLines    = 40
	maxStackLineText = 200
)

// printStack writes a panic's stack trace (StepError.Stack) under its error
// line: "stack" and then one indented line per line of the trace (a leading
// tab as four spaces), each at most maxStackLineText bytes and made
// visible (display.Terminal) like every value show prints, at most
// maxStackLines lines and then how many were left out. Nothing for an empty
// stack.
func printStack(w io.Writer, stack string) {
	stack = strings.TrimRight(stack, "\n")
	if stack == "" {
		return
	}
	lines := strings.Split(stack, "\n")
	label := "stack    "
	for i, line := range lines {
		if i == maxStackLines {
			fmt.Fprintf(w, "         … %d more lines (show --json has the whole trace)\n", len(lines)-i)
			return
		}
		indent := ""
		for strings.HasPrefix(line, "\t") {
			indent, line = indent+"    ", line[1:]
		}
		fmt.Fprintf(w, "%s%s%s\n", label, indent, oneLine(line, maxStackLineText))
		label = "         "
	}
}

// retryCmd: retry ID, retry ID ID..., or retry FILTER.
func retryCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return bulkCmd(ctx, "retry", args, stdout, stderr)
}

// cancelCmd: cancel ID, cancel ID ID..., cancel FILTER, or cancel --tree
// ID, with --reason.
func cancelCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return bulkCmd(ctx, "cancel", args, stdout, stderr)
}

// bulkCmd is retry and cancel: one id keeps the single call's exit codes
// (3 not found, 4 conflict); several ids or a filter act in bulk and print
// counts. A filter asks for confirmation on a terminal, and needs --yes
// elsewhere.
func bulkCmd(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(name)
	var c common
	c.register(fs)
	var ff filterFlags
	ff.register(fs)
	all := fs.Bool("all", false, "with no filter: act on every instance ("+map[string]string{"retry": "every failed one", "cancel": "every live one"}[name]+")")
	yes := fs.Bool("yes", false, "do not ask before acting on a filter or a tree (needed when stdin is not a terminal)")
	var reason *string
	tree := new(bool)
	if name == "cancel" {
		reason = fs.String("reason", "cancelled from the CLI", "recorded in each instance's error history")
		tree = fs.Bool("tree", false, "with one ID: cancel it and every live descendant (its children, theirs, ...), parents before their children; asks first, or --yes")
	}
	pos, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	f, err := ff.filter(name)
	if err != nil {
		return err
	}
	filtered := f.Queue != "" || f.Status != "" || f.Machine != "" || f.Step != "" || f.Search != "" || ff.since > 0
	scanSet := flagGiven(fs, "scan")
	switch {
	case scanSet && !filtered && !*all:
		// --scan bounds a filter's statements; ids and trees never scan.
		return usageError{msg: fmt.Sprintf("%s: --scan goes with a filter or --all, not with instance ids or --tree", name), help: true}
	case *tree && (filtered || *all):
		return usageError{msg: "cancel --tree takes one instance id, not a filter", help: true}
	case *tree && len(pos) != 1:
		return usageError{msg: fmt.Sprintf("cancel --tree takes one instance id, got %d", len(pos)), help: true}
	case len(pos) > 0 && (filtered || *all):
		return usageError{msg: fmt.Sprintf("%s: give instance ids or a filter, not both", name), help: true}
	case len(pos) == 0 && !filtered && !*all:
		return usageError{msg: fmt.Sprintf("%s needs instance ids, filter flags (those of list) or --all", name), help: true}
	case len(pos) > gendurable.MaxBulkIDs:
		return usageError{msg: fmt.Sprintf("%s: %d ids, at most %d at once (or use a filter)", name, len(pos), gendurable.MaxBulkIDs), help: true}
	}
	ids := make([]int64, len(pos))
	for i, p := range pos {
		if ids[i], err = parseID(p); err != nil {
			return err
		}
	}
	cancelReason := ""
	if reason != nil {
		cancelReason = *reason
		if strings.TrimSpace(cancelReason) == "" {
			// The library records its own default for an empty reason, not
			// the CLI's: refused, as the other flags refuse an empty value.
			return usageError{msg: "cancel: --reason is empty (leave the flag out for the default, \"cancelled from the CLI\")", help: true}
		}
		if strings.ContainsRune(cancelReason, 0) || !utf8.ValidString(cancelReason) {
			// The error history stores text: it would be stored without them.
			return usageError{msg: "cancel: --reason holds a NUL byte or invalid UTF-8", help: true}
		}
		if len(cancelReason) > gendurable.MaxReasonBytes {
			// Refused before a filter or a tree asks to confirm.
			return usageError{msg: fmt.Sprintf("cancel: --reason is %d bytes, at most %d", len(cancelReason), gendurable.MaxReasonBytes), help: true}
		}
	}
	switch {
	case *tree:
		// A tree may hold any number of instances: asked first, as a filter is.
		if err := confirm(ctx, fmt.Sprintf("cancel instance %d and every live descendant", ids[0]), *yes, stderr); err != nil {
			return err
		}
	case len(ids) == 0:
		f.All = *all
		if err := f.Validate(); err != nil {
			// Refused before it asks (a probe: --queue " default" wanted
			// --yes first, and the refusal followed the confirmation).
			return cliWords(err)
		}
		if err := confirmBulk(ctx, name, f, *yes, stderr); err != nil {
			return err
		}
	}
	eng, done, err := c.engine(ctx, stderr)
	if err != nil {
		return err
	}
	defer done()
	if *tree {
		res, err := eng.CancelTree(ctx, ids[0], cancelReason)
		return printBulk(stdout, c.json, res, err, fmt.Sprintf("cancelled %d of the %d instances of the tree of %d; %d skipped (already finished)",
			res.Changed, res.Matched, ids[0], res.Skipped))
	}
	if len(ids) == 1 {
		id := ids[0]
		var msg string
		if name == "retry" {
			err, msg = eng.Retry(ctx, id), fmt.Sprintf("instance %d is runnable again", id)
			if err == nil {
				msg = retriedMessage(ctx, eng, id, msg)
			}
		} else {
			err, msg = eng.Cancel(ctx, id, cancelReason), fmt.Sprintf("instance %d cancelled", id)
		}
		if err != nil {
			return err
		}
		if c.json {
			return printJSON(stdout, map[string]any{"id": id, "ok": true, "message": msg})
		}
		_, err = fmt.Fprintln(stdout, msg)
		return err
	}
	var res gendurable.BulkResult
	switch {
	case name == "retry" && len(ids) > 0:
		res, err = eng.RetryMany(ctx, ids)
	case name == "retry":
		res, err = eng.RetryMatching(ctx, f)
	case len(ids) > 0:
		res, err = eng.CancelMany(ctx, ids, cancelReason)
	default:
		res, err = eng.CancelMatching(ctx, f, cancelReason)
	}
	if errors.Is(err, gendurable.ErrInvalidInput) {
		err = cliWords(err)
	}
	verb := map[string]string{"retry": "retried", "cancel": "cancelled"}[name]
	why := map[string]string{"retry": "not failed, or their unique key is held by a live instance", "cancel": "already finished"}[name]
	msg := fmt.Sprintf("%s %d of %d matching instances; %d skipped (%s)", verb, res.Changed, res.Matched, res.Skipped, why)
	if res.NotFound > 0 {
		msg += fmt.Sprintf("; %s not found", display.Count(res.NotFound, "id"))
	}
	return printBulk(stdout, c.json, res, err, msg)
}

// printBulk prints a bulk call's counts (res as JSON, or msg) and returns
// its error. What was done is printed even when a later batch failed.
func printBulk(stdout io.Writer, asJSON bool, res gendurable.BulkResult, err error, msg string) error {
	if res.Matched == 0 && res.NotFound == 0 && err != nil {
		return err
	}
	if asJSON {
		if perr := printJSON(stdout, res); perr != nil && err == nil {
			err = perr
		}
		return err
	}
	if err != nil {
		// Counts of the batches before the error: the match went on past
		// them (an operator probe read "cancelled 500 of 500 matching" as
		// the whole of a match of 604).
		msg = "before the error: " + msg + "; the rest was not visited"
	}
	fmt.Fprintln(stdout, msg)
	return err
}

// confirmBulk asks before a retry or cancel by filter: on a terminal it
// prompts; elsewhere it needs --yes (exit 2).
func confirmBulk(ctx context.Context, name string, f gendurable.ListFilter, yes bool, stderr io.Writer) error {
	what := map[string]string{"retry": "retry every failed instance", "cancel": "cancel every live instance"}[name]
	return confirm(ctx, fmt.Sprintf("%s matching %s", what, f), yes, stderr)
}

// confirm asks q (a mutation of an unbounded number of instances) on a
// terminal; elsewhere it needs --yes (exit 2).
func confirm(ctx context.Context, q string, yes bool, stderr io.Writer) error {
	if yes {
		return nil
	}
	if !benchrun.IsTerminal(os.Stdin) {
		return usageError{msg: q + ": pass --yes to confirm (stdin is not a terminal to ask on)"}
	}
	ok, err := prompt(ctx, os.Stdin, stderr, q+"?")
	if err != nil {
		return err
	}
	if !ok {
		return errAborted
	}
	return nil
}

func runNowCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run-now")
	var c common
	c.register(fs)
	return c.withInstance(ctx, fs, args, stderr, nil, nil, func(eng *gendurable.Engine, id int64, _ []string) error {
		// Whether it was eligible already: RunNow leaves such a row as it
		// is and says nothing, and "is eligible now" read as a change (an
		// operator probe; the engine logs a change, not a no-op).
		before, berr := eng.WaitReason(ctx, id)
		already := berr == nil && before.Status == gendurable.StatusRunnable && !before.Delayed && before.LeaseExpiresAt == nil
		if err := eng.RunNow(ctx, id); err != nil {
			return err
		}
		msg := fmt.Sprintf("instance %d is eligible now", id)
		if already {
			msg = fmt.Sprintf("instance %d was eligible already: nothing changed", id)
		}
		// A row retried while its cancelled step's lease lived waits for
		// that lease, before RunNow as after it: the read above says so
		// (it was read a second time after RunNow).
		if berr == nil && before.Status == gendurable.StatusRunnable && before.LeaseExpiresAt != nil {
			msg = fmt.Sprintf("instance %d becomes eligible when the lease of its cancelled step ends (at %s), not now: that step may still be running",
				id, before.LeaseExpiresAt.UTC().Format(time.RFC3339))
		}
		if c.json {
			return printJSON(stdout, map[string]any{"id": id, "ok": true, "message": msg})
		}
		_, err := fmt.Fprintln(stdout, msg)
		return err
	})
}

// retriedMessage is what a retry of id says: plain, or what the instance
// now waits for — the lease of its cancelled step, or its live children.
func retriedMessage(ctx context.Context, eng *gendurable.Engine, id int64, plain string) string {
	w, err := eng.WaitReason(ctx, id)
	switch {
	case err != nil:
		return plain
	case w.Status == gendurable.StatusRunnable && w.LeaseExpiresAt != nil:
		return fmt.Sprintf("%s; it becomes eligible when the lease of its cancelled step ends (at %s): that step may still be running",
			plain, w.LeaseExpiresAt.UTC().Format(time.RFC3339))
	case w.Status == gendurable.StatusAwaitingChildren:
		// "finished", not "done": a failed or cancelled child counts too
		// (an operator probe read "1 of 6 done" of a cancelled one).
		return fmt.Sprintf("instance %d awaits its live children again (%d of %d finished)", id, w.ChildrenDone, w.ChildrenTotal)
	case w.Status == gendurable.StatusAwaitingSignal:
		return fmt.Sprintf("instance %d is parked again: %s", id, w.Summary)
	case w.Status == gendurable.StatusRunnable && w.Delayed:
		// Cancelled while it waited: the retry keeps the wait (a review:
		// "runnable again" read as "runs now").
		return fmt.Sprintf("%s, but %s, as when it was cancelled (gendurable run-now %d runs it now)", plain, w.Summary, id)
	}
	return plain
}

func signalCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("signal")
	var c common
	c.register(fs)
	// Given empty or twice, a usage error (as a filter is): an unset
	// variable in a script's --payload "$BODY" --dedup-key "$EVENT_ID"
	// sent a null payload without a dedup key, again on every rerun.
	var payload, dedup string
	fs.Var(&filterText{s: &payload, twice: errGivenTwice}, "payload", "JSON `payload` (default null)")
	fs.Var(&filterText{s: &dedup, twice: errGivenTwice}, "dedup-key", "dedup `key`: sending the same key twice is a no-op")
	var p any
	check := func(rest []string) error {
		if err := nameArg("signal name", rest[0]); err != nil {
			return err
		}
		if dedup != "" {
			// A key's rule, the library's: a search text's.
			if err := checkedText(gendurable.ListFilter{Search: dedup}, gendurable.ErrInvalidSignal, "filter: search text", "--dedup-key"); err != nil {
				return err
			}
		}
		if payload != "" {
			if !json.Valid([]byte(payload)) {
				return usageError{msg: "--payload is not valid JSON, or nests arrays and objects far deeper than the engine takes (Config.MaxJSONDepth, 1,000 levels by default)"}
			}
			p = json.RawMessage(payload)
		}
		return nil
	}
	return c.withInstance(ctx, fs, args, stderr, []string{"NAME"}, check, func(eng *gendurable.Engine, id int64, rest []string) error {
		name := rest[0]
		res, err := eng.Signal(ctx, id, name, p, &gendurable.SignalOpts{DedupKey: dedup})
		if err != nil {
			return err
		}
		msg := "gendurable: signal sent"
		if res.Duplicate {
			msg = "gendurable: signal not sent (a duplicate)" // nothing changed
		}
		c.logger(stderr).Info(msg, "id", id, "name", name, "signal_id", res.ID, "duplicate", res.Duplicate, "woke", res.Woke)
		if c.json {
			// "id" is the signal's (SignalResult's own field, kept); the
			// instance is named too, as every other command's JSON names
			// it (a newcomer's probe took "id" for the instance).
			return printJSON(stdout, struct {
				gendurable.SignalResult
				Instance int64 `json:"instance"`
			}{res, id})
		}
		switch {
		case res.Duplicate:
			fmt.Fprintf(stdout, "duplicate of signal %d: nothing sent\n", res.ID)
		case res.Woke:
			fmt.Fprintf(stdout, "signal %d sent; instance %d woke up\n", res.ID, id)
		default:
			fmt.Fprintf(stdout, "signal %d sent to instance %d's inbox\n", res.ID, id)
		}
		return nil
	})
}

func pauseCmd(pause bool) func(context.Context, []string, io.Writer, io.Writer) error {
	name := map[bool]string{true: "pause", false: "resume"}[pause]
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		fs := newFlags(name)
		var c common
		c.register(fs)
		create := fs.Bool("create", false, "accept a queue that has no instance and no row yet (creates its row)")
		pos, err := parse(fs, args, "QUEUE")
		if err != nil {
			return err
		}
		if err := nameArg("queue", pos[0]); err != nil {
			return err
		}
		eng, done, err := c.engine(ctx, stderr)
		if err != nil {
			return err
		}
		defer done()
		if err := eng.SetPaused(ctx, pos[0], pause, &gendurable.QueueOpts{Create: *create}); err != nil {
			if errors.Is(err, gendurable.ErrUnknownQueue) {
				return fmt.Errorf("%w (pass --create to %s it anyway)", err, name)
			}
			return err
		}
		if c.json {
			return printJSON(stdout, map[string]any{"queue": pos[0], "paused": pause})
		}
		_, err = fmt.Fprintf(stdout, "queue %s %sd\n", display.Terminal(pos[0]), name)
		return err
	}
}

// queueCmd is `queue remove NAME`: delete an empty queue's row.
func queueCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("queue remove")
	var c common
	c.register(fs)
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		return helpRequest{fs}
	}
	if len(args) == 0 || args[0] != "remove" {
		return usageError{msg: "queue takes: remove QUEUE", help: true}
	}
	pos, err := parse(fs, args[1:], "QUEUE")
	if err != nil {
		return err
	}
	if err := nameArg("queue", pos[0]); err != nil {
		return err
	}
	eng, done, err := c.engine(ctx, stderr)
	if err != nil {
		return err
	}
	defer done()
	if err := eng.RemoveQueue(ctx, pos[0]); err != nil {
		return err
	}
	if c.json {
		return printJSON(stdout, map[string]any{"queue": pos[0], "removed": true})
	}
	_, err = fmt.Fprintf(stdout, "queue %s removed\n", display.Terminal(pos[0]))
	return err
}

// pruneAskBelow: a prune with a retention shorter than this asks first
// (or needs --yes): it deletes results that callers of Wait, and operators,
// may still be reading — "0s" deletes every finished instance but each
// periodic schedule's newest slot.
const pruneAskBelow = time.Hour

func pruneCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("prune")
	var c common
	c.register(fs)
	retention := fs.Duration("retention", gendurable.DefaultRetention, "delete instances finished longer ago than this (e.g. 72h)")
	yes := fs.Bool("yes", false, "do not ask before a --retention under "+pruneAskBelow.String())
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if *retention < 0 {
		return usageError{msg: fmt.Sprintf("prune: --retention %s is negative", *retention), help: true}
	}
	if *retention < pruneAskBelow {
		q := fmt.Sprintf("prune: delete every instance finished more than %s ago, with its result", *retention)
		if err := confirm(ctx, q, *yes, stderr); err != nil {
			return err
		}
	}
	eng, done, err := c.engine(ctx, stderr)
	if err != nil {
		return err
	}
	defer done()
	var progress func(int64)
	if benchrun.IsTerminal(os.Stderr) {
		progress = func(n int64) { fmt.Fprintf(stderr, "\rpruned %d…", n) }
	}
	n, err := eng.Prune(ctx, *retention, progress) // logged by the engine, on the CLI's logger
	if progress != nil {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		if n > 0 { // the batches before the error committed
			return fmt.Errorf("%w (%d instances were deleted before it)", err, n)
		}
		return err
	}
	if c.json {
		return printJSON(stdout, map[string]any{"deleted": n, "retention": retention.String()})
	}
	_, err = fmt.Fprintf(stdout, "deleted %s finished more than %s ago\n", display.Count(n, "instance"), *retention)
	return err
}

func demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo")
	dbURL := new(string)
	databaseURLFlag(fs, dbURL, "PostgreSQL `URL` (default DATABASE_URL; unset: a private throwaway PostgreSQL)")
	o := demo.Options{Out: stdout}
	o.Schema = "gendurable_demo" // the default; given empty, refused like every command's (schemaFlag)
	fs.Var(schemaFlag(&o.Schema), "schema", "the `name` of the demo's own schema: created, marked, recreated on every run; an existing schema the demo did not create is refused")
	fs.BoolVar(&o.ResetSchema, "reset-schema", false, "drop an existing --schema that the demo did not create if it holds only gendurable's objects, their instances with them; never public (asks on a terminal; elsewhere needs --yes)")
	yes := fs.Bool("yes", false, "do not ask before --reset-schema drops a schema")
	fs.IntVar(&o.Orders, "orders", 200, fmt.Sprintf("checkouts to run (at most %d)", demo.MaxOrders))
	fs.IntVar(&o.Workers, "workers", 3, fmt.Sprintf("engines working the queue (at most %d)", demo.MaxWorkers))
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if o.Orders < 1 || o.Orders > demo.MaxOrders || o.Workers < 1 || o.Workers > demo.MaxWorkers {
		return usageError{msg: fmt.Sprintf("demo: --orders must be within 1..%d and --workers within 1..%d", demo.MaxOrders, demo.MaxWorkers), help: true}
	}
	o.Confirm = confirmer(ctx, stderr, *yes)
	o.AuditLogger = cliLogger(stderr, false)
	o.DatabaseURL = *dbURL
	if o.DatabaseURL == "" {
		if v, set := os.LookupEnv("DATABASE_URL"); set && strings.TrimSpace(v) == "" {
			return errEmptyEnvDatabaseURL // not a throwaway server in place of the database meant
		}
		o.DatabaseURL = os.Getenv("DATABASE_URL")
	}
	if o.DatabaseURL != "" { // "": a throwaway PostgreSQL
		if _, err := parseDatabaseURL(o.DatabaseURL); err != nil {
			return err
		}
	}
	if f, ok := stdout.(*os.File); ok {
		o.Live = benchrun.IsTerminal(f)
	}
	_, err := demo.Run(ctx, o)
	return err
}

// exitCode maps an error to the CLI's exit codes.
func exitCode(err error) int {
	switch errorCode(err) {
	case "":
		return exitOK
	case "usage", "invalid_input":
		return exitUsage
	case "not_found":
		return exitNotFound
	case "conflict":
		return exitConflict
	}
	return exitError
}

// errorCode is the "code" of an error in --json output: usage (the
// command line is wrong), invalid_input (a value the library refused),
// not_found, conflict, not_migrated, schema_version, aborted (a confirmation answered no),
// cannot_connect (the server refused or could not be reached, or a pooler in
// statement pooling refused the command's transaction),
// connection_lost (connected, then the connection or the server went
// mid-command: a restart, a terminated session, a network cut), or error
// (anything else).
func errorCode(err error) string {
	var ue usageError
	is := func(targets ...error) bool {
		for _, t := range targets {
			if errors.Is(err, t) {
				return true
			}
		}
		return false
	}
	switch {
	case err == nil:
		return ""
	case errors.As(err, &ue), is(flag.ErrHelp, scratch.ErrNotScratch):
		return "usage"
	case is(gendurable.ErrInvalidSignal, gendurable.ErrInvalidConfig, gendurable.ErrInvalidInput, gendurable.ErrInvalidSchema):
		return "invalid_input"
	case is(gendurable.ErrNotFound, gendurable.ErrUnknownQueue):
		return "not_found"
	case is(gendurable.ErrNotRetryable, gendurable.ErrNotCancellable, gendurable.ErrQueueNotEmpty, gendurable.ErrUniqueConflict,
		gendurable.ErrInstanceFinished, gendurable.ErrNotDelayed, migrate.ErrDirection, migrate.ErrDependents, scratch.ErrBusy):
		return "conflict"
	case is(migrate.ErrSchemaUnknown):
		return "schema_version"
	case is(gendurable.ErrNotMigrated, gendurable.ErrSchemaVersion):
		return "not_migrated"
	case is(errAborted):
		return "aborted"
	case errors.As(err, new(*pgconn.ConnectError)), sqlq.StatementPooling(err):
		// PgBouncer in statement pooling refuses a command's first
		// transaction, and every mutation that spans statements runs in
		// one: nothing of it committed. It was connection_lost, "may or
		// may not have been committed" (a PgBouncer probe).
		return "cannot_connect"
	case sqlq.ConnectionFailure(err):
		return "connection_lost"
	}
	return "error"
}

// cliWords is err (an API's refusal of a filter) in the command line's
// words: its flags where the message names the API's fields ("set All"
// read, to an operator, as a field they had no way to set).
func cliWords(err error) error {
	msg := strings.NewReplacer("set All to act", "pass --all to act", "From is not after", "--since is not after",
		"To is after", "the range's end is after").Replace(err.Error())
	if msg == err.Error() {
		return err
	}
	return reworded{msg: msg, err: err}
}

// reworded is an error with its message rewritten (cliWords), still
// wrapping it for errors.Is and the exit code.
type reworded struct {
	msg string
	err error
}

func (r reworded) Error() string { return r.msg }
func (r reworded) Unwrap() error { return r.err }

// nameArg refuses, before any connection, a queue, machine or signal name
// whose text the library refuses (empty, too long, a control or
// bidirectional character, white space around it; exit 2), as README's
// "CLI" promises ("validated … before any SQL runs"): read after the
// schema's version, such a name was exit 1 (cannot_connect) while the
// database could not be reached. what is "queue", "machine" or "signal
// name"; the error wraps what the library's call would return
// (ErrInvalidInput, ErrInvalidSignal for a signal's name), and the library
// checks the name again, whole (a signal's name also for invisible
// characters).
func nameArg(what, s string) error {
	sentinel := gendurable.ErrInvalidInput
	if what == "signal name" {
		sentinel = gendurable.ErrInvalidSignal
	}
	if s == "" {
		// A filter leaves an empty field out; a name is required.
		return fmt.Errorf("%w: %s %q is empty", sentinel, what, s)
	}
	var f gendurable.ListFilter
	field := what
	switch what {
	case "queue":
		f.Queue = s
	case "machine":
		f.Machine = s
	default:
		f.Step, field = s, "step"
	}
	return checkedText(f, sentinel, "filter: "+field, what)
}

// checkedText is f.Validate's refusal in the words of the flag or argument
// it came from (field → what), wrapping sentinel, or nil.
func checkedText(f gendurable.ListFilter, sentinel error, field, what string) error {
	err := f.Validate()
	if err == nil {
		return nil
	}
	msg := strings.TrimPrefix(err.Error(), gendurable.ErrInvalidInput.Error()+": ")
	msg = strings.NewReplacer(field, what, " (no id or key does)", "").Replace(msg)
	return fmt.Errorf("%w: %s", sentinel, msg)
}
