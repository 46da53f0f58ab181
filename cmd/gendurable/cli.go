package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/gendurable/gendurable/internal/benchrun"
	"github.com/gendurable/gendurable/migrate"
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

const usage = `usage: gendurable <command> [flags]

commands:
  migrate up|down|status|print   install, remove or inspect the schema (print: the SQL)
  status                         instance counts by queue and status
  list                           list instances (filters: --queue --status --machine --step --search --since)
  show ID                        one instance: state, errors, signals, children, what it waits for
  retry ID                       a failed instance runs again
  cancel ID [--reason R]         fail a live instance now
  signal ID NAME [--payload J]   send a signal
  pause QUEUE / resume QUEUE     stop or restart picking a queue, in every process
                                 (an unknown queue is refused unless --create)
  queue remove QUEUE             delete the row of a queue that has no instances
  prune [--retention D]          delete finished instances older than D
  ui [--addr A]                  serve the dashboard (credentials: --token-file, --basic-auth-file,
                                 or GENDURABLE_UI_TOKEN / GENDURABLE_UI_BASIC_AUTH; --allowed-host H)
  demo                           run the checkout demo (a throwaway PostgreSQL if no database is given)
  bench                          run a benchmark workload (see gendurable bench -h)

Every command takes --database-url, --schema (default public) and --json.
Exit codes: 0 ok, 1 failure, 2 bad usage, 3 not found (instance, queue), 4 conflict (e.g. retry of
a live instance, removing a queue that has instances).

The database is --database-url, else DATABASE_URL, else postgres://postgres@127.0.0.1:5432/postgres.
`

// run is the whole CLI, testable without a process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	commands := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"migrate": migrateCmd, "bench": benchCmd, "status": statusCmd, "list": listCmd, "show": showCmd,
		"retry": retryCmd, "cancel": cancelCmd, "signal": signalCmd, "pause": pauseCmd(true),
		"resume": pauseCmd(false), "queue": queueCmd, "prune": pruneCmd, "demo": demoCmd, "ui": uiCmd,
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	cmd := commands[args[0]]
	if cmd == nil {
		fmt.Fprintf(stderr, "gendurable: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	err := cmd(ctx, args[1:], stdout, stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stderr, "gendurable:", printable(err.Error()))
	}
	return exitCode(err)
}

type usageError struct{ msg string }

// errAborted: the operator answered no to a confirmation.
var errAborted = errors.New("aborted: nothing changed")

func (e usageError) Error() string { return e.msg }

func databaseURL(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if v := os.Getenv("DATABASE_URL"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/postgres"
}

func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "PostgreSQL URL")
	schema := fs.String("schema", "public", "schema holding gendurable's tables")
	asJSON := fs.Bool("json", false, "print JSON")
	yes := fs.Bool("yes", false, "down: do not ask for confirmation (needed when stdin is not a terminal)")
	if len(args) == 0 {
		return usageError{"migrate needs up, down, status or print"}
	}
	action := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if action == "print" {
		sql, err := migrate.SQL(*schema, 0, migrate.Latest())
		if err != nil {
			return err
		}
		_, err = io.WriteString(stdout, sql)
		return err
	}
	pool, err := pgxpool.New(ctx, databaseURL(*dbURL))
	if err != nil {
		return err
	}
	defer pool.Close()
	var res migrate.Result
	switch action {
	case "up":
		res, err = migrate.Up(ctx, pool, *schema)
	case "down":
		if err := confirmDown(ctx, pool, *schema, *yes, stderr); err != nil {
			return err
		}
		res, err = migrate.Down(ctx, pool, *schema)
	case "status":
		var v int
		if v, err = migrate.Installed(ctx, pool, *schema); err == nil {
			res = migrate.Result{From: v, To: v}
		}
	default:
		return usageError{fmt.Sprintf("unknown migrate action %q", action)}
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"schema": *schema, "from": res.From, "to": res.To, "applied": res.Applied, "latest": migrate.Latest()})
	}
	if action == "status" {
		_, err = fmt.Fprintf(stdout, "schema %s: version %d (latest %d)\n", *schema, res.To, migrate.Latest())
		return err
	}
	_, err = fmt.Fprintf(stdout, "schema %s: version %d → %d (applied %v)\n", *schema, res.From, res.To, res.Applied)
	return err
}

func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o benchrun.Options
	dbURL := fs.String("database-url", "", "PostgreSQL URL")
	fs.StringVar(&o.Schema, "schema", "gendurable_bench", "bench's own schema: created, marked, dropped at the end; an existing schema bench did not create is refused")
	fs.BoolVar(&o.ResetSchema, "reset-schema", false, "drop an existing --schema that bench did not create, and everything in it (asks on a terminal)")
	yes := fs.Bool("yes", false, "do not ask before --reset-schema drops a schema")
	fs.StringVar(&o.Workload, "workload", "job", "job, fsm3, signal, fanout, partition or keys (key parallelism and tenant fairness; see BENCHMARKS.md)")
	fs.IntVar(&o.N, "n", 20000, "instances to insert (fanout: parents, each with 10 children; keys: rows of the parallelism phase)")
	fs.IntVar(&o.FairBacklog, "fair-backlog", 100_000, "keys: tenant A's runnable rows in the fairness phase")
	fs.IntVar(&o.KeyRate, "key-rate", 50, "keys: starts per second of the rated key in the rate phase")
	fs.DurationVar(&o.RateWindow, "rate-window", 30*time.Second, "keys: how long the rate phase measures the rated key's starts")
	fs.IntVar(&o.Concurrency, "concurrency", 100, "steps running at once per queue per engine")
	fs.IntVar(&o.Prefetch, "prefetch", 0, "rows claimed beyond running slots (default = concurrency)")
	fs.IntVar(&o.Queues, "queues", 1, "queues the instances are spread over")
	fs.IntVar(&o.Engines, "engines", 1, "engines (workers) in this process")
	fs.IntVar(&o.Commits, "commits", 0, "outcome statements in flight per engine (default: the engine's)")
	fs.IntVar(&o.MinDemand, "min-demand", 0, "don't pick for fewer free places than this (default: the engine's)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	backlog := fs.Bool("backlog", false, "measure one pick's latency at 10k and 1M runnable rows instead")
	idle := fs.Duration("idle", 0, "measure the statements/s of an idle engine over this long instead (after 12s of backoff)")
	fs.BoolVar(&o.FreshStats, "fresh-stats", false, "start from a fresh table's statistics instead of a table in use's (mostly done rows, ANALYZEd, then emptied)")
	floor := fs.Int("floor", 0, "measure the physical floor instead: rows/s of 500-row UPDATE … FROM unnest by primary key from this many connections for 10s (a job writes its row twice)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	pickup := fs.Int("pickup", 0, "measure insert → step-start latency over this many locally inserted jobs instead")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected arguments %v", fs.Args())}
	}
	o.DatabaseURL = databaseURL(*dbURL)
	o.Confirm = confirmer(stderr, *yes)
	if benchrun.IsTerminal(os.Stderr) {
		o.Progress = stderr
	}
	if *idle > 0 {
		res, err := benchrun.Idle(ctx, o, 12*time.Second, *idle)
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(res)
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
			return json.NewEncoder(stdout).Encode(res)
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
			return json.NewEncoder(stdout).Encode(res)
		}
		_, err = fmt.Fprintf(stdout, "pickup latency of a local insert (%d samples): p50 %.2f ms, p90 %.2f ms, max %.2f ms\n", res.Samples, res.P50Ms, res.P90Ms, res.MaxMs)
		return err
	}
	if *backlog {
		res, err := benchrun.Backlog(ctx, o, []int{10_000, 1_000_000}, 50, 20, progressOr(o.Progress))
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(map[string]any{"backlog": res, "ratio_1m_over_10k": res[1].MedianMs / res[0].MedianMs})
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
	return benchrun.Print(stdout, rep, *asJSON)
}

// confirmDown asks before `migrate down` drops every gendurable table of
// schema: on a terminal it prompts; elsewhere it needs --yes (exit 2).
func confirmDown(ctx context.Context, pool *pgxpool.Pool, schema string, yes bool, stderr io.Writer) error {
	if yes {
		return nil
	}
	if v, err := migrate.Installed(ctx, pool, schema); err == nil && v == 0 {
		return nil // nothing to drop
	}
	q := fmt.Sprintf("migrate down drops every gendurable table in schema %q, with all its instances and signals", schema)
	if !benchrun.IsTerminal(os.Stdin) {
		return usageError{q + "; pass --yes to confirm (stdin is not a terminal to ask on)"}
	}
	ok, err := prompt(os.Stdin, stderr, q+". Continue?")
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
