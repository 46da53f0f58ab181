package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	neturl "net/url"
	"os"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/benchrun"
	"github.com/gendurable/gendurable/internal/display"
	"github.com/gendurable/gendurable/internal/longhorizon"
	"github.com/gendurable/gendurable/internal/pgurl"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Exit codes.
const (
	exitOK       = 0
	exitError    = 1 // the command failed (database unreachable, ...)
	exitUsage    = 2 // the command line (or a value in it) is wrong
	exitNotFound = 3 // no such instance
	exitConflict = 4 // the instance is not in a state that allows it
)

// command is one subcommand: how it is called and what it does.
type command struct {
	synopsis string // after "gendurable ", e.g. "show ID [flags]"
	summary  string // one paragraph for --help
	run      func(context.Context, []string, io.Writer, io.Writer) error
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"migrate": {"migrate up|down|status|print [flags]", "Install or upgrade (up), remove (down: asks first, or --yes), inspect (status) or print (print: the SQL, from --from to --to) gendurable's tables in --schema; --to moves up or down to a version of your choice.", migrateCmd},
		"status":  {"status [flags]", "Instance counts by queue and status, with each queue's pause flag.", statusCmd},
		"list":    {"list [filter flags] [flags]", "List instances, newest first, one page at a time. A page looks at no more than --scan instances; follow next_before (--before) for more.", listCmd},
		"show":    {"show ID [flags]", "One instance: state, result, error history (a panic's stack trace, its first 40 lines; --json has it whole), signals, children, parent and what it waits for.", showCmd},
		"retry": {"retry ID [ID...] | retry --queue Q --status failed ... (filter flags) | retry --all [flags]",
			"Run failed instances again at the step they failed in, with a fresh attempt budget (one cancelled while it waited — a sleep, RunAt, a backoff — waits out the rest: run-now ends that). By id (one, or up to 1000), or every failed instance a filter matches (the flags of list; asks first, or --yes). Prints how many were matched, retried and skipped.", retryCmd},
		"cancel": {"cancel ID [ID...] | cancel (filter flags) | cancel --all | cancel --tree ID [--reason R] [flags]",
			"Fail live instances now, recording --reason in their error history; a worker running one of their steps is fenced out. By id (one, or up to 1000), every live instance a filter matches (the flags of list; asks first, or --yes), or, with --tree, an instance and every live descendant, parents first (asks first, or --yes).", cancelCmd},
		"run-now":  {"run-now ID [flags]", "Make a scheduled (RunAt, RunIn) or backing-off instance eligible now. Its attempt count is kept. One already eligible is left as it is (exit 0); one executing, awaiting a signal or children, or finished is refused (exit 4).", runNowCmd},
		"signal":   {"signal ID NAME [--payload JSON] [--dedup-key K] [flags]", "Send a durable signal to an instance; it wakes if it awaits NAME.", signalCmd},
		"pause":    {"pause QUEUE [--create] [flags]", "Stop every process from picking QUEUE (steps already running finish). An unknown queue is refused unless --create.", pauseCmd(true)},
		"resume":   {"resume QUEUE [--create] [flags]", "Let every process pick QUEUE again. An unknown queue is refused unless --create.", pauseCmd(false)},
		"queue":    {"queue remove QUEUE [flags]", "Delete the row (pause flag) of a queue that has no instances.", queueCmd},
		"prune":    {"prune [--retention D] [flags]", "Delete finished (done or failed) instances that finished more than D ago, with their signals.", pruneCmd},
		"ui":       {"ui [--addr A] [flags]", "Serve the dashboard. Beyond loopback it needs a bearer token or basic auth (--token-file, --basic-auth-file, or GENDURABLE_UI_TOKEN / GENDURABLE_UI_BASIC_AUTH).", uiCmd},
		"demo":     {"demo [flags]", "Run the checkout demo in its own schema (on a private throwaway PostgreSQL if no database is given).", demoCmd},
		"machines": {"machines [NAME] [flags]", "Every machine an engine stored when it started (name, versions, steps); with NAME, its graph: steps (a Flow's in declared order, otherwise by name) with instance counts, declared and taken transitions.", machinesCmd},
		"bench":    {"bench [flags]", "Run a benchmark workload in bench's own schema (see BENCHMARKS.md).", benchCmd},
		"version":  {"version [--json]", "This binary's version, the VCS revision it was built from, and the schema version it needs.", versionCmd},
	}
}

const usage = `usage: gendurable <command> [flags]

commands:
  migrate up|down|status|print   install, upgrade, remove or inspect the schema (--to N: a version; print: the SQL)
  status                         instance counts by queue and status
  list                           list instances (filters: --queue --status --machine --step --search --since)
  show ID                        one instance: state, errors, signals, children, what it waits for
  retry ID... | retry FILTER     failed instances run again (FILTER: the flags of list, or --all)
  cancel ID... | cancel FILTER   fail live instances now [--reason R]
  cancel --tree ID               the same for an instance and every live descendant
  run-now ID                     a scheduled or backing-off instance runs now
  signal ID NAME [--payload J]   send a signal
  pause QUEUE / resume QUEUE     stop or restart picking a queue, in every process
                                 (an unknown queue is refused unless --create)
  queue remove QUEUE             delete the row of a queue that has no instances
  prune [--retention D]          delete finished instances older than D
  machines [NAME]                every machine stored by an engine at its start; with NAME, its graph:
                                 steps in declared order with counts, declared and taken transitions
  ui [--addr A]                  serve the dashboard (credentials: --token-file, --basic-auth-file,
                                 or GENDURABLE_UI_TOKEN / GENDURABLE_UI_BASIC_AUTH; --allowed-host H)
  demo                           run the checkout demo (a throwaway PostgreSQL if no database is given)
  bench                          run a benchmark workload (see gendurable bench -h; --long-horizon:
                                 the long-horizon benchmark's adapter, configured by the environment)
  version                        this binary's version and the schema version it needs (also --version)

"gendurable <command> --help" shows a command's arguments and flags.
"--" ends the flags: every argument after it is an argument, however it looks.
Every database command takes --database-url (not empty), --schema (not empty; default public, but
demo and bench default to their own schemas) and --json (all but demo).

With --json, output is JSON with snake_case names, and an error is {"error": {"code": ...,
"message": ..., "exit_code": ...}} on stderr. Exit codes: 0 ok; 1 failure (code "error";
"not_migrated": run gendurable migrate up; "schema_version": the schema is newer than this
binary, or its version comment is gone — see the message; "aborted": a confirmation answered no;
"cannot_connect": the server refused or could not be reached, or refused the user, password or
database, or PgBouncer in statement pooling refused the command's transaction; "connection_lost": the connection or the server went mid-command, and a change may
or may not have been committed); 2 bad usage
or input ("usage", "invalid_input"); 3 not found ("not_found": instance, queue); 4 conflict
("conflict": e.g. retry of a live instance, run-now of one not waiting to run, removing a queue
that has instances, a migrate down that a view or another table's foreign key would stop).

Attempts are shown counted from 1 ("attempt 1 of 3" is the first run; one failed after its
last lease expired shows "3 of 3"); the JSON "attempt" fields count from 0, as the Go API does.

Mutations (retry, cancel, run-now, signal, pause, resume, queue remove, prune, a migrate that
applied a version, a --reset-schema drop) are logged to stderr, one line each (JSON with --json),
with the operating-system user.

The database is --database-url, else DATABASE_URL, else postgres://postgres@127.0.0.1:5432/postgres
(demo, with neither, starts a private throwaway PostgreSQL).
`

// run is the whole CLI, testable without a process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if len(args) > 1 {
			if _, ok := commands[args[1]]; ok {
				return run(ctx, []string{args[1], "--help"}, stdout, stderr)
			}
			if !strings.HasPrefix(args[1], "-") {
				// help bogus: an unknown command, not the general usage
				// and exit 0 (an operator probe). help --json, help -h:
				// the usage, as before.
				err := usageError{msg: fmt.Sprintf("unknown command %q (gendurable help lists them)", args[1])}
				reportError(stderr, "help", err, wantsJSON(args[1:]), "", secretsIn(args)...)
				return exitCode(err)
			}
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	asJSON := wantsJSON(args[1:])
	cmd, ok := commands[args[0]]
	var err error
	switch {
	case !ok && strings.HasPrefix(args[0], "-"):
		// gendurable --database-url URL status: say where flags go, naming
		// the command if one follows (flag values are not repeated: a URL
		// may hold a password).
		flag, _, _ := strings.Cut(args[0], "=")
		cmdName := "<command>"
		if i := slices.IndexFunc(args, func(a string) bool { _, ok := commands[a]; return ok }); i > 0 {
			cmdName = args[i]
			asJSON = wantsJSON(slices.Concat(args[:i], args[i+1:]))
		}
		err = usageError{msg: fmt.Sprintf("%s before the command: flags go after it (gendurable %s %s …; gendurable help lists the commands)", flag, cmdName, flag)}
	case !ok:
		err = usageError{msg: fmt.Sprintf("unknown command %q (gendurable help lists them)", args[0])}
	case waitsNoted[args[0]]:
		// An operator command that waits on the database — a row locked by
		// another transaction, a slow server — says so after a while
		// rather than hang without a word.
		sw := &syncWriter{w: stderr}
		stop := noteStillWaiting(sw, args[0], asJSON, stillWaitingAfter, bulkByFilter(args))
		err = cmd.run(ctx, args[1:], stdout, sw)
		stop()
	default:
		err = cmd.run(ctx, args[1:], stdout, stderr)
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Ctrl-C or SIGTERM: say so, rather than "context canceled".
		err = fmt.Errorf("%s stopped: %v (%w)", args[0], context.Cause(ctx), err)
	}
	var help helpRequest
	if errors.As(err, &help) {
		printHelp(stdout, args[0], help.fs)
		return exitOK
	}
	if err != nil {
		reportError(stderr, args[0], err, asJSON, databaseSource(args[1:]), secretsIn(args)...)
	}
	return exitCode(err)
}

// waitsNoted are the commands that say so when they wait on the database
// for longer than stillWaitingAfter (not ui, demo and bench, which run on
// by design, nor prune, which reports its progress).
var waitsNoted = map[string]bool{"status": true, "list": true, "show": true, "machines": true, "retry": true,
	"cancel": true, "run-now": true, "signal": true, "pause": true, "resume": true, "queue": true, "migrate": true}

// bulkByFilter reports a retry or cancel command line (args[0] the
// command) that acts by filter, on --all or on a tree: flags of those
// before any "--".
func bulkByFilter(args []string) bool {
	if args[0] != "retry" && args[0] != "cancel" {
		return false
	}
	for _, a := range args[1:] {
		if a == "--" {
			break
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && slices.Contains([]string{"all", "tree", "queue", "status", "machine", "step", "search", "since", "scan"}, name) {
			return true
		}
	}
	return false
}

// readOnlyCommands change nothing in the database: a connection lost
// mid-command left nothing half done.
var readOnlyCommands = map[string]bool{"status": true, "list": true, "show": true, "machines": true, "version": true}

// stillWaitingAfter is how long a command of waitsNoted runs before it
// says it is still waiting.
const stillWaitingAfter = 5 * time.Second

// noteStillWaiting writes one line to w after d unless the returned stop
// is called first; once stop returns, nothing more is written.
//
// A bulk retry or cancel by filter (or a tree) works through its matches in
// batches, each committed as it goes: "still waiting" read as stuck on a
// lock while batches committed steadily (a probe, 60,000 rows), so its note
// says that first.
func noteStillWaiting(w *syncWriter, cmd string, asJSON bool, d time.Duration, batches bool) (stop func()) {
	msg := fmt.Sprintf("gendurable: %s: still waiting on the database after %s (the server may be slow or not answering, "+
		"or a row it needs locked by another transaction); Ctrl-C stops it, and what was already committed stays", cmd, d)
	if batches {
		msg = fmt.Sprintf("gendurable: %s: still running after %s: it works through the matching instances in batches of %d, "+
			"each committed as it goes (or the server is slow, or a row it needs is locked by another transaction); "+
			"Ctrl-C stops it, and what was already committed stays", cmd, d, gendurable.BulkBatch)
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.closed {
			return
		}
		if w.prompting || time.Since(w.answered) < d {
			t.Reset(d) // it was waiting on the operator, not the database
			return
		}
		if asJSON {
			b, _ := json.Marshal(map[string]string{"msg": msg})
			_, _ = w.w.Write(append(b, '\n'))
			return
		}
		_, _ = io.WriteString(w.w, msg+"\n")
	})
	return func() {
		t.Stop()
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
	}
}

// syncWriter serializes the writes of a command and of its still-waiting
// note.
type syncWriter struct {
	mu        sync.Mutex
	w         io.Writer
	closed    bool      // the note may no longer be written
	prompting bool      // a y/N question waits for the operator
	answered  time.Time // when the last one was answered
}

// asking marks a question to the operator under way (true) or answered.
func (s *syncWriter) asking(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prompting = on
	if !on {
		s.answered = time.Now()
	}
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// wantsJSON reports whether the command line asks for --json, so that even
// an error in parsing it is reported as JSON.
// It reads --json's value as the flag package does (strconv.ParseBool:
// --json=T, --json=True, ... too); the last --json given wins.
func wantsJSON(args []string) bool {
	asJSON := false
	for _, a := range args {
		if a == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "json" {
			continue
		}
		if !hasValue {
			asJSON = true
			continue
		}
		if b, err := strconv.ParseBool(value); err == nil {
			asJSON = b
		}
	}
	return asJSON
}

// printHelp writes a command's synopsis, summary and flags.
func printHelp(w io.Writer, name string, fs *flag.FlagSet) {
	c := commands[name]
	fmt.Fprintf(w, "usage: gendurable %s\n\n%s\n", c.synopsis, c.summary)
	if fs != nil {
		fmt.Fprintf(w, "\nflags:\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
}

// databaseSource is where a command run with args took its database URL
// from, for a connection error's hint: "--database-url" if args set it,
// "DATABASE_URL" if the environment did, else "" (the default chain).
func databaseSource(args []string) string {
	for _, a := range args {
		if a == "--" {
			break
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "database-url" {
			return "--database-url"
		}
	}
	if os.Getenv("DATABASE_URL") != "" {
		return "DATABASE_URL"
	}
	return ""
}

// reportError writes err once: "gendurable: message" (the library's own
// errors already start with "gendurable: "), or as {"error": {...}} with
// --json. dbSource is where the command's database URL came from
// (databaseSource), for a connection error's hint.
func reportError(w io.Writer, name string, err error, asJSON bool, dbSource string, secrets ...string) {
	msg := migrateHint(tidyConnectError(name, err.Error(), err, dbSource), dbSource)
	if errors.Is(err, gendurable.ErrNotMigrated) && !strings.Contains(msg, "check --schema") {
		// After the README's demo, `list` looked in public: the advice was
		// to install empty tables there (a newcomer's probe).
		msg += " (or check --schema: the demo works in gendurable_demo)"
	}
	msg = hideSecrets(msg, secrets)
	if !strings.HasPrefix(msg, "gendurable: ") {
		msg = "gendurable: " + msg
	}
	if advice := sqlq.PoolerAdvice(err); advice != "" && !strings.Contains(msg, advice) {
		msg += " (" + advice + ")"
	}
	if errorCode(err) == "connection_lost" && !readOnlyCommands[name] {
		// The statement may have committed before its answer was lost
		// (a retry or cancel run again acts again, or is refused as
		// a conflict): say so rather than leave "terminating connection"
		// to be read as "nothing happened".
		check := "check with show or list before running it again"
		if name == "migrate" {
			// Each version commits on its own, and running it again goes
			// on from where the schema is (an upgrade probe: show and list
			// say nothing of the schema's version).
			check = "`gendurable migrate status` says which version the schema is at; running it again goes on from there"
		}
		msg += " (the connection was lost mid-command: what it changed may or may not have been committed; " + check + ")"
	}
	var ue usageError
	if errors.As(err, &ue) && ue.help && commands[name].run != nil {
		msg += fmt.Sprintf(" (gendurable %s --help shows its usage)", name)
	}
	msg = clipMessage(msg)
	if asJSON {
		_ = printJSON(w, map[string]any{"error": map[string]any{"code": errorCode(err), "message": msg, "exit_code": exitCode(err)}})
		return
	}
	// Line by line: a message that quotes a program's output (a throwaway
	// server's failed start quotes postgres's log) keeps its lines, each
	// made safe for the terminal, rather than one line of \x0a; a line
	// after the first is indented under "  | ", so no text inside an error
	// (a database's message, a value echoed) reads as a line of the
	// command's own (the review).
	lines := strings.Split(strings.TrimRight(msg, "\n"), "\n")
	for i, l := range lines {
		lines[i] = display.Terminal(l)
	}
	fmt.Fprintln(w, strings.Join(lines, "\n  | "))
}

// maxErrorBytes bounds an error message the CLI prints: one that echoes a
// huge argument (an id, a duration, a schema name of 120 KB: a probe) is
// cut in the middle, keeping its start and its end, where the advice is.
const maxErrorBytes = 4096

// clipMessage is msg cut to about maxErrorBytes (see there), on rune
// boundaries.
func clipMessage(msg string) string {
	if len(msg) <= maxErrorBytes {
		return msg
	}
	head, tail := maxErrorBytes/2, maxErrorBytes/4
	for head > 0 && !utf8.RuneStart(msg[head]) {
		head--
	}
	start := len(msg) - tail
	for start < len(msg) && !utf8.RuneStart(msg[start]) {
		start++
	}
	return fmt.Sprintf("%s … (%d bytes of this message cut) … %s", msg[:head], start-head, msg[start:])
}

// migrateHint rewrites the library's advice to migrate for a command line:
// without the Go API's name, and saying which database it is about — given
// --database-url, the advice says to pass the same one (pasted without it,
// it migrated DATABASE_URL's database, or the local server's: a newcomer's
// probe); else it names DATABASE_URL or the default URL the command used (a
// newcomer read "not migrated" of the local server as of their own
// database). The URL given is not repeated: it may hold a password.
func migrateHint(msg, dbSource string) string {
	const advice = "`gendurable migrate up --schema "
	if !strings.Contains(msg, advice) {
		return msg
	}
	msg = strings.ReplaceAll(msg, "` (or migrate.Up)", "`")
	if dbSource == "--database-url" {
		// "migrate up --schema S` with the same --database-url first"
		i := strings.Index(msg, advice) + len(advice)
		if j := strings.Index(msg[i:], "`"); j >= 0 {
			msg = msg[:i+j+1] + " with the same --database-url" + msg[i+j+1:]
		}
		return msg
	}
	source := "DATABASE_URL's"
	if dbSource == "" {
		source = "the default, " + defaultDatabaseURL + ", as neither --database-url nor DATABASE_URL was set"
	}
	return msg + " (the database is " + source + ")"
}

// tidyConnectError rewrites, within msg (err's message), pgx's report of a
// failed connection — one line per address tried, each twice under the
// default sslmode=prefer (with TLS, then without), joined by newlines that
// would print as \x0a\x09 — as one line: each distinct failure once (the
// TLS attempt's "server refused TLS connection" left out when another line
// says more), then where command name's database URL comes from.
func tidyConnectError(name, msg string, err error, dbSource string) string {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || ce.Config == nil {
		return msg
	}
	var causes []error
	switch u := ce.Unwrap().(type) {
	case interface{ Unwrap() []error }:
		causes = u.Unwrap()
	case error:
		causes = []error{u}
	}
	var details []string
	for _, c := range causes {
		for line := range strings.SplitSeq(c.Error(), "\n") {
			if line = strings.TrimSpace(line); line != "" && !slices.Contains(details, line) {
				details = append(details, line)
			}
		}
	}
	if len(details) > 1 {
		details = slices.DeleteFunc(details, func(d string) bool { return strings.HasSuffix(d, "tls error: server refused TLS connection") })
	}
	source := "--database-url, else DATABASE_URL, else " + defaultDatabaseURL
	if name == "demo" {
		source = "--database-url, else DATABASE_URL, else a throwaway PostgreSQL"
	}
	if dbSource != "" {
		source = dbSource // what this run set (a newcomer read the whole chain after giving --database-url)
	}
	if errors.As(err, new(fromEnvDatabase)) {
		source = "DATABASE_URL"
	}
	tidy := fmt.Sprintf("cannot connect to the database as user %s, database %s: %s (the database is %s)",
		ce.Config.User, ce.Config.Database, strings.Join(details, "; "), source)
	if full := ce.Error(); strings.Contains(msg, full) {
		return strings.Replace(msg, full, tidy, 1)
	}
	return msg
}

// fromEnvDatabase marks an error of a command whose database is DATABASE_URL
// alone (bench --long-horizon), for tidyConnectError's hint.
type fromEnvDatabase struct{ error }

func (e fromEnvDatabase) Unwrap() error { return e.error }

// newFlags is a command's flag set: parse errors are returned, never
// printed (run prints one message), and -h/--help ask for printHelp.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args with fs, turning -h into a helpRequest and any
// other parse error into a usage error.
//
// Every flag may be given once (onceValue): the flag package keeps the last
// of several, so `migrate down --to 20 --to 0 --yes` removed every table and
// `--schema a --schema b` worked in b, without a word.
func parseFlags(fs *flag.FlagSet, args []string) error {
	// Wrapped for the parse only: the flag package prints a flag's type
	// and default (--help) from its own Value types.
	seenAny, _ := flagsSeen.LoadOrStore(fs, map[string]bool{})
	seen := seenAny.(map[string]bool)
	orig := map[string]flag.Value{}
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(refusesTwice); ok || repeatable[f.Name] {
			return // refuses a second value itself, or takes several
		}
		orig[f.Name] = f.Value
		w := onceValue{Value: f.Value, name: f.Name, seen: seen}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = &onceBool{w}
		} else {
			f.Value = &w
		}
	})
	defer fs.VisitAll(func(f *flag.Flag) {
		if v, ok := orig[f.Name]; ok {
			f.Value = v
		}
	})
	if err := swallowedFlag(fs, args); err != nil {
		return err
	}
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return helpRequest{fs}
	}
	return usageError{msg: fs.Name() + ": " + err.Error() + wantedForm(fs, err), help: true}
}

// swallowedFlag refuses a flag that takes a value followed by another flag
// of the command, as in `--dedup-key $ID --json` with ID empty: the flag
// package takes "--json" as the dedup key, and the command ran with it (a
// signal deduplicated against "--json" forever after, and no JSON printed).
// A value that is meant to look like a flag is written --flag=value.
func swallowedFlag(fs *flag.FlagSet, args []string) error {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			return nil // the flags end here: the flag package stops too
		}
		name := valueNext(fs, a)
		if name == "" {
			continue
		}
		if i+1 < len(args) {
			next := args[i+1]
			nextName, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(next, "-"), "-"), "=")
			if strings.HasPrefix(next, "-") && nextName != "" && (fs.Lookup(nextName) != nil || nextName == "h" || nextName == "help") {
				flagAsGiven := a[:len(a)-len(strings.TrimLeft(a, "-"))] + name
				return usageError{msg: fmt.Sprintf("%s: %s has no value: the word after it, %q, is a flag (is a variable empty? "+
					"a value that starts with a dash is written %s=VALUE)", fs.Name(), flagAsGiven, next, flagAsGiven), help: true}
			}
		}
		i++ // its value
	}
	return nil
}

// secretsIn are the words of a command line that may hold a password: an
// argument that looks like a connection string, the value of a flag that
// does (--x=URL), and --database-url's value in either form. Whatever path
// an error takes — the flag package's own messages (`--database-url A
// --database-url B` printed B in its "given twice" error: an operator
// probe; "bad flag syntax: ---database-url=…"), a name or value echoed by
// a command — reportError leaves them out of the message (a review of the
// probe's first fixes found a dozen such paths).
func secretsIn(args []string) []string {
	var out []string
	for i, a := range args {
		if looksLikeConnString(a) {
			// As given, and the password alone: the flag package quotes
			// parts of a word ("flag provided but not defined:
			// -database-url:postgres://u:pw@h/db?sslmode", cut at its =).
			out = append(out, a)
			out = append(out, passwordsIn(a)...)
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case hasValue && v != "" && (name == "database-url" || looksLikeConnString(v)):
			out = append(out, v)
		case !hasValue && name == "database-url" && i+1 < len(args) && args[i+1] != "":
			out = append(out, args[i+1])
		}
	}
	return out
}

// passwordsIn are the passwords a connection string s holds, as written
// and percent-decoded: a URL's (between the first ':' of its user
// information and the last '@' before its query, so that one holding an
// '@' or a '/' is found whole) and the values of password= pairs. One of
// fewer than 3 bytes is left out: hiding it everywhere would hide the
// message instead.
func passwordsIn(s string) []string {
	var out []string
	add := func(pw string) {
		if len(pw) < 3 {
			return
		}
		out = append(out, pw)
		if dec, err := neturl.PathUnescape(pw); err == nil && dec != pw && len(dec) >= 3 {
			out = append(out, dec)
		}
	}
	if _, rest, ok := strings.Cut(s, "://"); ok {
		rest, _, _ = strings.Cut(rest, "?")
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				add(pw)
			}
		}
	}
	for _, m := range connPasswordValueRE.FindAllStringSubmatch(s, -1) {
		add(strings.Trim(m[1], "'"))
	}
	return out
}

var connPasswordValueRE = regexp.MustCompile(`(?i)(?:^|[\s?&])(?:password|sslpassword)\s*=\s*('[^']*'|[^\s&]+)`)

// hideSecrets is msg with each of secrets, as given or quoted, replaced by
// a note that it is not shown; the longest first, so that no part of one
// is left by a shorter one inside it.
func hideSecrets(msg string, secrets []string) string {
	secrets = slices.Clone(secrets)
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	const hidden = "(not shown: it may hold a password)"
	for _, s := range secrets {
		if strings.TrimSpace(s) == "" {
			continue
		}
		msg = strings.ReplaceAll(msg, strconv.Quote(s), hidden)
		msg = strings.ReplaceAll(msg, s, hidden)
	}
	return msg
}

// looksLikeConnString reports whether s looks like a PostgreSQL connection
// string: a URL, or keyword=value pairs naming a password.
func looksLikeConnString(s string) bool {
	return strings.Contains(s, "://") || connPasswordRE.MatchString(s)
}

var connPasswordRE = regexp.MustCompile(`(?i)(^|\s)(password|passfile|sslpassword)\s*=`)

// flagsSeen holds, per flag set, the flags given so far: parseAll parses
// one set several times (flags before and after the arguments).
var flagsSeen sync.Map // *flag.FlagSet → map[string]bool

// repeatable are the flags that may be given more than once: each value
// adds to the others.
var repeatable = map[string]bool{"allowed-host": true, "trusted-origin": true}

// onceValue is a flag's Value, during a parse, that refuses a second value
// (parseFlags).
type onceValue struct {
	flag.Value
	name string
	seen map[string]bool
}

func (v *onceValue) Set(s string) error {
	if v.seen[v.name] {
		return errGivenTwice
	}
	v.seen[v.name] = true
	if g, ok := v.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case int, int64, uint, uint64:
			if !plainDecimal(s) {
				return errNotDecimal
			}
		}
	}
	return v.Value.Set(s)
}

// errNotDecimal: an integer flag's value is not written in plain decimal.
// The flag package reads integers as Go literals: 020 as octal 16, 0x10 as
// 16, 1_0 as 10, so `migrate down --to 020 --yes` removed versions down to
// 16 (a hostile-operator probe). Ids given as arguments were decimal
// already.
var errNotDecimal = errors.New("want a whole number written in decimal, without a leading zero, sign + or _ (not 020, 0x10, +5 or 1_000)")

// plainDecimal reports s as "0", or digits not starting with 0, with an
// optional leading '-'.
func plainDecimal(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" || len(s) > 1 && s[0] == '0' {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func (v *onceValue) String() string {
	if v == nil || v.Value == nil {
		return ""
	}
	return v.Value.String()
}

// Get is the wrapped value's, for wantedForm (which reads it before the
// parse's wrappers are taken off).
func (v *onceValue) Get() any {
	if g, ok := v.Value.(flag.Getter); ok {
		return g.Get()
	}
	return v.Value.String()
}

// onceBool is onceValue for a boolean flag (--yes, --json), which the flag
// package must still see as one: it takes no value.
type onceBool struct{ onceValue }

func (*onceBool) IsBoolFlag() bool { return true }

// refusesTwice marks a flag Value that refuses a second value itself, with
// its own message (filterText, sinceFlag).
type refusesTwice interface{ refusesTwice() }

// wantedForm says what form a flag's value takes when the flag package
// could only say "parse error".
func wantedForm(fs *flag.FlagSet, err error) string {
	_, rest, ok := strings.Cut(err.Error(), " for flag -")
	if !ok || !strings.HasSuffix(rest, ": parse error") {
		return ""
	}
	f := fs.Lookup(strings.TrimPrefix(strings.TrimSuffix(rest, ": parse error"), "-"))
	if f == nil {
		return ""
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case time.Duration:
		return " (want a duration such as 30s, 5m or 2h)"
	case int, int64, uint, uint64:
		return " (want a whole number)"
	case float64:
		return " (want a number)"
	case bool:
		return " (want true or false)"
	}
	return ""
}

// helpRequest: -h or --help was given; run prints the command's help.
type helpRequest struct{ fs *flag.FlagSet }

func (helpRequest) Error() string { return "help requested" }

// usageError: the command line is wrong (exit 2). help: the message
// points to the command's --help.
type usageError struct {
	msg  string
	help bool
}

// flagGiven reports whether the command line set the flag name (to any
// value, its default included).
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// errAborted: the operator answered no to a confirmation.
var errAborted = errors.New("aborted: nothing changed")

func (e usageError) Error() string { return e.msg }

// parseDatabaseURL parses a database URL (or key=value string); one that
// does not parse is a usage error (exit 2), for every command alike. pgx
// masks a password in its message. A URL that sets no connect_timeout (nor
// PGCONNECT_TIMEOUT) gets pgurl.DefaultConnectTimeout
// (TestSilentServerIsAConnectionErrorInBoundedTime).
func parseDatabaseURL(url string) (*pgxpool.Config, error) {
	cfg, err := pgurl.ParseConfig(url)
	if err != nil {
		return nil, usageError{msg: fmt.Sprintf("database URL: %v", err)} // its connection string not repeated (pgurl.HideConnString)
	}
	return cfg, nil
}

// databaseURL is the URL a command connects to: flagValue (--database-url,
// never empty: refused as it is parsed), else DATABASE_URL, else
// defaultDatabaseURL. A DATABASE_URL set to nothing (or white space) is a
// usage error, as an empty --database-url is: `DATABASE_URL="$TARGET"
// gendurable migrate down --yes` with TARGET unset acted on the local
// server's database, saying neither was set (a newcomer's probe).
func databaseURL(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	v, set := os.LookupEnv("DATABASE_URL")
	if set && strings.TrimSpace(v) == "" {
		return "", errEmptyEnvDatabaseURL
	}
	if v != "" {
		return v, nil
	}
	return defaultDatabaseURL, nil
}

// errEmptyEnvDatabaseURL: DATABASE_URL is set but empty.
var errEmptyEnvDatabaseURL = usageError{msg: "DATABASE_URL is set but empty: give it the database's URL, or unset it " +
	"(unset: " + defaultDatabaseURL + "; demo: a throwaway PostgreSQL), or pass --database-url"}

// defaultDatabaseURL is the database of every command (but demo's) when
// neither --database-url nor DATABASE_URL is given.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres"

func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("migrate")
	dbURL := new(string)
	databaseURLFlag(fs, dbURL, "PostgreSQL `URL` (default DATABASE_URL, else the local server)")
	schema := new(string)
	*schema = "public"
	fs.Var(schemaFlag(schema), "schema", "the `name` of the schema holding gendurable's tables (not empty)")
	asJSON := fs.Bool("json", false, "print JSON")
	yes := fs.Bool("yes", false, "down: do not ask for confirmation (needed when stdin is not a terminal)")
	to := fs.Int("to", 0, "up, down, print: the `version` to migrate to (default: up and print the latest, down 0)")
	from := fs.Int("from", 0, "print: the `version` the script starts from (0: a fresh install)")
	if len(args) == 0 {
		return usageError{msg: "migrate needs up, down, status or print", help: true}
	}
	action := args[0]
	if strings.HasPrefix(action, "-") {
		// Flags first (migrate --help, migrate --json up): parse them, then
		// the action must follow.
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			return usageError{msg: "migrate needs up, down, status or print", help: true}
		}
		action, args = fs.Arg(0), fs.Args()
	}
	switch action {
	case "up", "down", "status", "print":
	default:
		return usageError{msg: fmt.Sprintf("unknown migrate action %q (want up, down, status or print)", action), help: true}
	}
	// Flags may come before or after an argument, as every command's: the
	// arguments refused below are named alone, never the flags after them
	// (a --database-url's password was printed with them: an operator
	// probe; reportError hides a connection string typed as one).
	extra, err := parseAll(fs, args[1:])
	if err != nil {
		return err
	}
	if len(extra) > 0 {
		return usageError{msg: fmt.Sprintf("migrate %s takes no arguments, got %q", action, extra), help: true}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	target := *to
	if !set["to"] {
		target = migrate.Latest()
		if action == "down" {
			target = 0
		}
	}
	switch {
	case target < 0 || target > migrate.Latest():
		return usageError{msg: fmt.Sprintf("migrate %s: --to %d outside 0..%d (the versions this gendurable knows)", action, *to, migrate.Latest()), help: true}
	case *from < 0 || *from > migrate.Latest():
		return usageError{msg: fmt.Sprintf("migrate %s: --from %d outside 0..%d", action, *from, migrate.Latest()), help: true}
	case *from != 0 && action != "print":
		return usageError{msg: fmt.Sprintf("migrate %s: --from is print's (up and down start from the installed version)", action), help: true}
	case set["to"] && action == "status":
		return usageError{msg: "migrate status: --to is up's, down's and print's", help: true}
	}
	if action == "print" {
		sql, err := migrate.SQL(*schema, *from, target)
		if err != nil {
			return err
		}
		if *asJSON {
			// One object, as every other command's --json: the script in
			// "sql", with what it migrates.
			return json.NewEncoder(stdout).Encode(struct {
				Schema string `json:"schema"`
				From   int    `json:"from"`
				To     int    `json:"to"`
				SQL    string `json:"sql"`
			}{*schema, *from, target, sql})
		}
		if sql == "" {
			// Nothing on stdout (a script to pipe on), but not silence:
			// an empty output read as a failure to a reviewer.
			fmt.Fprintf(stderr, "gendurable: migrate print: --from %d and --to %d are the same version: no SQL to print\n", *from, target)
			return nil
		}
		_, err = io.WriteString(stdout, sql)
		return err
	}
	url, err := databaseURL(*dbURL)
	if err != nil {
		return err
	}
	cfg, err := parseDatabaseURL(url)
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer closePool(pool)
	var res migrate.Result
	switch action {
	case "up", "down":
		var installed int
		if installed, err = migrate.Installed(ctx, pool, *schema); err != nil {
			return err
		}
		newer := installed > migrate.Latest() // migrate.To says so, typed
		if action == "up" && target < installed && !newer {
			return usageError{msg: fmt.Sprintf("migrate up: --to %d is below the installed version %d (migrate down --to %d moves down)", target, installed, target)}
		}
		if action == "down" && target > installed && !newer {
			return usageError{msg: fmt.Sprintf("migrate down: --to %d is above the installed version %d (migrate up --to %d moves up)", target, installed, target)}
		}
		if action == "down" {
			if err := confirmDown(ctx, pool, *schema, target, *yes, stderr); err != nil {
				return err
			}
		}
		// The direction is checked again under the migration's lock: a
		// concurrent migrator may have moved the schema since it was read
		// above (and since a down was confirmed).
		if action == "up" {
			res, err = migrate.UpTo(ctx, pool, *schema, target)
		} else {
			res, err = migrate.DownTo(ctx, pool, *schema, target)
		}
	case "status":
		var v int
		if v, err = migrate.Installed(ctx, pool, *schema); err == nil {
			res = migrate.Result{From: v, To: v}
			if v > migrate.Latest() {
				err = newerSchema(*schema, v)
			}
		}
	default:
		return usageError{msg: fmt.Sprintf("unknown migrate action %q", action)}
	}
	if len(res.Applied) > 0 { // a change to the schema: on the audit trail, as every mutation
		if err != nil {
			// Stopped part way: the versions committed before the error
			// changed the schema all the same (migrate.Result).
			cliLogger(stderr, *asJSON).Warn("gendurable: schema migrated part way", "schema", *schema, "from", res.From, "to", res.To,
				"applied", res.Applied, "err", err)
		} else {
			cliLogger(stderr, *asJSON).Info("gendurable: schema migrated", "schema", *schema, "from", res.From, "to", res.To, "applied", res.Applied)
		}
	}
	if err != nil {
		return err
	}
	if *asJSON {
		applied := res.Applied
		if applied == nil {
			applied = []int{}
		}
		return printJSON(stdout, map[string]any{"schema": *schema, "from": res.From, "to": res.To, "applied": applied, "latest": migrate.Latest()})
	}
	// Version 0 before and after: nothing of gendurable's is there (a
	// newcomer's misspelled --schema read "version 0" as an answer).
	none := ""
	if res.From == 0 && res.To == 0 {
		none = fmt.Sprintf(": no gendurable tables in schema %s (is --schema right?)", *schema)
	}
	if action == "status" {
		_, err = fmt.Fprintf(stdout, "schema %s: version %d (latest %d)%s\n", *schema, res.To, migrate.Latest(), none)
		return err
	}
	if len(res.Applied) == 0 && none == "" {
		_, err = fmt.Fprintf(stdout, "schema %s: version %d, nothing to apply\n", *schema, res.To)
		return err
	}
	_, err = fmt.Fprintf(stdout, "schema %s: version %d → %d (applied %v)%s\n", *schema, res.From, res.To, res.Applied, none)
	return err
}

func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench")
	var o benchrun.Options
	dbURL := new(string)
	databaseURLFlag(fs, dbURL, "PostgreSQL `URL` (default DATABASE_URL, else the local server)")
	o.Schema = "gendurable_bench" // the default; given empty, refused like every command's (schemaFlag)
	fs.Var(schemaFlag(&o.Schema), "schema", "the `name` of bench's own schema: created, marked, dropped at the end; an existing schema bench did not create is refused")
	fs.BoolVar(&o.ResetSchema, "reset-schema", false, "drop an existing --schema that bench did not create if it holds only gendurable's objects, their instances with them; never public (asks on a terminal; elsewhere needs --yes)")
	yes := fs.Bool("yes", false, "do not ask before --reset-schema drops a schema")
	fs.StringVar(&o.Workload, "workload", "job", "job, fsm3, signal, fanout, partition or keys (key parallelism and tenant fairness; see BENCHMARKS.md)")
	fs.IntVar(&o.N, "n", 20000, "instances to insert (fanout: parents, each with 10 children; keys: rows of the parallelism phase)")
	fs.IntVar(&o.FairBacklog, "fair-backlog", 100_000, "keys: tenant A's runnable rows in the fairness phase")
	fs.IntVar(&o.KeyRate, "key-rate", 50, "keys: starts per second of the rated key in the rate phase")
	fs.DurationVar(&o.RateWindow, "rate-window", 30*time.Second, "keys: how long the rate phase measures the rated key's starts")
	fs.IntVar(&o.Concurrency, "concurrency", 100, "steps running at once per queue per engine")
	fs.IntVar(&o.Prefetch, "prefetch", 0, "rows claimed beyond running slots (default = concurrency)")
	fs.IntVar(&o.Queues, "queues", 1, fmt.Sprintf("queues the instances are spread over (at most %d)", benchrun.MaxQueues))
	fs.IntVar(&o.Engines, "engines", 1, fmt.Sprintf("engines (workers) in this process (at most %d)", benchrun.MaxEngines))
	fs.IntVar(&o.Commits, "commits", 0, "outcome statements in flight per engine (default: the engine's)")
	fs.IntVar(&o.MinDemand, "min-demand", 0, "don't pick for fewer free places than this (default: the engine's)")
	fs.DurationVar(&o.StepSleep, "step-sleep", 0, "job: each step sleeps this long")
	fs.DurationVar(&o.Heartbeat, "heartbeat", 0, "the engines' heartbeat interval (default: the engine's, 20s; not keys)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	backlog := fs.Bool("backlog", false, "measure one pick's latency at 10k and 1M runnable rows instead")
	heldPick := fs.Bool("held-pick", false, "measure one pick of 16 after 10k, 50k and 180k rows were claimed, with and without an xid held open meanwhile, with and without the pick's floor, instead")
	idle := fs.Duration("idle", 0, "measure the statements/s of an idle engine over this long instead (after 12s of backoff)")
	fs.BoolVar(&o.FreshStats, "fresh-stats", false, "start from a fresh table's statistics instead of a table in use's (mostly done rows, ANALYZEd, then emptied)")
	floor := fs.Int("floor", 0, "measure the physical floor instead: rows/s of 500-row UPDATE … FROM unnest by primary key from this many connections for 10s (a job writes its row twice)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	pickup := fs.Int("pickup", 0, "measure insert → step-start latency over this many locally inserted jobs instead")
	longHorizon := fs.Bool("long-horizon", false, "run as an adapter of the public long-horizon benchmark instead: configured by the environment only "+
		"(DATABASE_URL, SCENARIO, PRODUCER_MODE, PRODUCER_RATE, TARGET_DEPTH, WORKER_COUNT, JOB_PAYLOAD_BYTES, JOB_WORK_MS, SAMPLE_EVERY_S; see BENCHMARKS.md), "+
		"JSON lines on stdout until SIGTERM")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if !slices.Contains(benchrun.Workloads, o.Workload) {
		return usageError{msg: fmt.Sprintf("bench: unknown --workload %q (want one of %s)", o.Workload, strings.Join(benchrun.Workloads, ", ")), help: true}
	}
	// Counts whose flag has a default of its own: 0 is no "default" here
	// (the library's would differ, or 0 ran silently on 1 or 100), and a
	// negative one is refused in the same words (it said "0: the default").
	for _, c := range []struct {
		flag string
		v    int
	}{{"-n", o.N}, {"--concurrency", o.Concurrency}, {"--queues", o.Queues}, {"--engines", o.Engines},
		{"--fair-backlog", o.FairBacklog}, {"--key-rate", o.KeyRate}} {
		if c.v < 1 {
			return usageError{msg: fmt.Sprintf("bench: %s must be at least 1 (default %s)", c.flag,
				fs.Lookup(strings.TrimLeft(c.flag, "-")).DefValue), help: true}
		}
	}
	if err := nonNegative("bench", map[string]int{"prefetch": o.Prefetch, "commits": o.Commits,
		"min-demand": o.MinDemand, "floor": *floor, "pickup": *pickup}); err != nil {
		return err
	}
	if *floor > benchrun.MaxFloorConns {
		return usageError{msg: fmt.Sprintf("bench: --floor must be at most %d connections", benchrun.MaxFloorConns), help: true}
	}
	if o.Commits > gendurable.MaxCommitConcurrency {
		return usageError{msg: fmt.Sprintf("bench: --commits must be at most %d (the engine's CommitConcurrency)", gendurable.MaxCommitConcurrency), help: true}
	}
	if o.Queues > benchrun.MaxQueues || o.Engines > benchrun.MaxEngines {
		return usageError{msg: fmt.Sprintf("bench: --queues must be at most %d and --engines at most %d", benchrun.MaxQueues, benchrun.MaxEngines), help: true}
	}
	if o.RateWindow <= 0 || *idle < 0 {
		return usageError{msg: "bench: --rate-window must be positive and --idle not negative", help: true}
	}
	if err := o.CheckStepOptions(); err != nil {
		return usageError{msg: err.Error(), help: true}
	}
	if *longHorizon {
		if fs.NFlag() > 1 {
			return usageError{msg: "bench: --long-horizon is configured by the environment only: it takes no other flag"}
		}
		err := benchrun.LongHorizon(ctx, os.Getenv, stdout, stderr)
		switch {
		case errors.Is(err, longhorizon.ErrInvalidEnv):
			return usageError{msg: err.Error()}
		case err != nil:
			return fromEnvDatabase{err}
		}
		return nil
	}
	var err error
	if o.DatabaseURL, err = databaseURL(*dbURL); err != nil {
		return err
	}
	if _, err := parseDatabaseURL(o.DatabaseURL); err != nil {
		return err
	}
	o.Confirm = confirmer(ctx, stderr, *yes)
	o.AuditLogger = cliLogger(stderr, *asJSON)
	if benchrun.IsTerminal(os.Stderr) {
		o.Progress = stderr
	}
	if *idle > 0 {
		res, err := benchrun.Idle(ctx, o, 12*time.Second, *idle)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, res)
		}
		_, err = fmt.Fprintf(stdout, "idle engine: %d statements in %.0fs = %.2f statements/s\n", res.Statements, res.Seconds, res.StatementsPerSecond)
		return err
	}
	if *floor > 0 {
		res, err := benchrun.Floor(ctx, o, *floor, 10*time.Second)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, res)
		}
		_, err = fmt.Fprintf(stdout, "physical floor at %d connections: %.0f rows/s (500-row UPDATE … FROM unnest by primary key) = at most %.0f jobs/s\n",
			res.Conns, res.RowsPerSec, res.JobsPerSec)
		return err
	}
	if *pickup > 0 {
		res, err := benchrun.Pickup(ctx, o, *pickup)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, res)
		}
		_, err = fmt.Fprintf(stdout, "pickup latency of a local insert (%d samples): p50 %.2f ms, p90 %.2f ms, max %.2f ms\n", res.Samples, res.P50Ms, res.P90Ms, res.MaxMs)
		return err
	}
	if *heldPick {
		res, err := benchrun.HeldPick(ctx, o, []int{10_000, 50_000, 180_000}, 16, 20, progressOr(o.Progress))
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, map[string]any{"held_pick": res})
		}
		for _, r := range res {
			fmt.Fprintf(stdout, "pick of %d after %6d claims, held xid %-5v floor %-5v: median %7.2f ms, p90 %7.2f ms, "+
				"%8.0f index entries, %6.0f index blocks, %6.0f heap blocks per pick", r.Batch, r.Claimed, r.Held, r.Floor,
				r.MedianMs, r.P90Ms, r.IndexTuples, r.IndexBlocks, r.HeapBlocks)
			if r.Floor {
				fmt.Fprintf(stdout, "; floor check %.2f ms", r.CheckMs)
			}
			fmt.Fprintln(stdout)
		}
		return nil
	}
	if *backlog {
		res, err := benchrun.Backlog(ctx, o, []int{10_000, 1_000_000}, 50, 20, progressOr(o.Progress))
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, map[string]any{"backlog": res, "ratio_1m_over_10k": res[1].MedianMs / res[0].MedianMs})
		}
		for _, r := range res {
			fmt.Fprintf(stdout, "pick of %d at %8d runnable: median %.2f ms, p90 %.2f ms\n", r.Batch, r.Runnable, r.MedianMs, r.P90Ms)
		}
		_, err = fmt.Fprintf(stdout, "ratio 1M/10k median: %.2f\n", res[1].MedianMs/res[0].MedianMs)
		return err
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := benchrun.Run(ctx, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, rep)
	}
	return benchrun.Print(stdout, rep, false)
}

// confirmDown asks before `migrate down` drops every gendurable table of
// schema: on a terminal it prompts; elsewhere it needs --yes (exit 2).
func confirmDown(ctx context.Context, pool *pgxpool.Pool, schema string, target int, yes bool, stderr io.Writer) error {
	if yes {
		return nil
	}
	if v, err := migrate.Installed(ctx, pool, schema); err == nil && v <= target {
		return nil // nothing to drop
	}
	q := fmt.Sprintf("migrate down drops every gendurable table in schema %q, with all its instances and signals", schema)
	if target > 0 {
		q = fmt.Sprintf("migrate down --to %d drops what the later versions added to schema %q: the data in those "+
			"columns and tables is lost, and migrating up again does not bring it back", target, schema)
	}
	if !benchrun.IsTerminal(os.Stdin) {
		return usageError{msg: q + "; pass --yes to confirm (stdin is not a terminal to ask on)"}
	}
	ok, err := prompt(ctx, os.Stdin, stderr, q+". Continue?")
	if err != nil {
		return err
	}
	if !ok {
		return errAborted
	}
	return nil
}

func progressOr(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// nonNegative refuses negative values of integer flags (0 means the
// default for each of them).
func nonNegative(cmd string, flags map[string]int) error {
	for _, name := range slices.Sorted(maps.Keys(flags)) {
		if flags[name] < 0 {
			return usageError{msg: fmt.Sprintf("%s: --%s must not be negative (0: the default)", cmd, name), help: true}
		}
	}
	return nil
}
