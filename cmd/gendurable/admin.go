package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/benchrun"
	"github.com/gendurable/gendurable/internal/demo"
	"github.com/gendurable/gendurable/internal/scratch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// common holds the flags every database command takes.
type common struct {
	dbURL  string
	schema string
	json   bool
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dbURL, "database-url", "", "PostgreSQL URL (default DATABASE_URL, else the local server)")
	fs.StringVar(&c.schema, "schema", "public", "schema holding gendurable's tables")
	fs.BoolVar(&c.json, "json", false, "print JSON")
}

// engine opens a pool and an insert-only engine for admin calls.
func (c *common) engine(ctx context.Context) (*gendurable.Engine, func(), error) {
	pool, err := pgxpool.New(ctx, databaseURL(c.dbURL))
	if err != nil {
		return nil, nil, err
	}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: c.schema})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return eng, pool.Close, nil
}

// parse parses flags that may come before or after the positional
// arguments, and checks the number of positional arguments.
func parse(fs *flag.FlagSet, args []string, positional ...string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != len(positional) {
		return nil, usageError{fmt.Sprintf("%s takes %s", fs.Name(), strings.Join(positional, " "))}
	}
	return pos, nil
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usageError{fmt.Sprintf("%q is not an instance id", s)}
	}
	return id, nil
}

func statusCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	if _, err := parse(fs, args); err != nil {
		return err
	}
	eng, done, err := c.engine(ctx)
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
		fmt.Fprintf(tw, "%s\t%v\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", printable(q.Queue), q.Paused, b[gendurable.StatusRunnable], b[gendurable.StatusExecuting],
			b[gendurable.StatusAwaitingSignal], b[gendurable.StatusAwaitingChildren], b[gendurable.StatusDone], b[gendurable.StatusFailed], q.Total)
	}
	return tw.Flush()
}

func listCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	var f gendurable.ListFilter
	var status string
	var since time.Duration
	fs.StringVar(&f.Queue, "queue", "", "only this queue")
	fs.StringVar(&status, "status", "", "only this status (runnable, executing, awaiting_signal, awaiting_children, done, failed)")
	fs.StringVar(&f.Machine, "machine", "", "only this machine")
	fs.StringVar(&f.Step, "step", "", "only instances at this step")
	fs.StringVar(&f.Search, "search", "", "an exact instance id, partition key or unique key (index lookups)")
	fs.DurationVar(&since, "since", 0, "only instances inserted within this long")
	fs.IntVar(&f.Limit, "limit", 50, fmt.Sprintf("rows (at most %d)", gendurable.MaxListLimit))
	fs.Int64Var(&f.Before, "before", 0, "page: only ids below this (the previous page's next_before)")
	fs.IntVar(&f.MaxScan, "scan", gendurable.DefaultListScan, fmt.Sprintf("look at no more than this many instances (at most %d)", gendurable.MaxListScan))
	if _, err := parse(fs, args); err != nil {
		return err
	}
	f.Status = gendurable.Status(status)
	if since > 0 {
		f.From = time.Now().Add(-since)
	}
	eng, done, err := c.engine(ctx)
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
	for _, in := range page.Instances {
		fmt.Fprintf(tw, "%d\t%s@%d\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", in.ID, printable(in.Machine), in.Version, printable(in.Queue), printable(in.Step), printable(string(in.Status)),
			in.Attempt, in.MaxAttempts, in.InsertedAt.Local().Format(time.DateTime), oneLine(in.LastError, 60))
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

func showCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("show", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	pos, err := parse(fs, args, "ID")
	if err != nil {
		return err
	}
	id, err := parseID(pos[0])
	if err != nil {
		return err
	}
	eng, done, err := c.engine(ctx)
	if err != nil {
		return err
	}
	defer done()
	d, err := eng.Describe(ctx, id)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(stdout, d)
	}
	p := printable
	fmt.Fprintf(stdout, "instance %d  %s@%d  queue %s\n", d.ID, p(d.Machine), d.Version, p(d.Queue))
	fmt.Fprintf(stdout, "status   %s at step %s (attempt %d of %d)\n", p(string(d.Status)), p(d.Step), d.Attempt, d.MaxAttempts)
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
		fmt.Fprintf(stdout, "error    %s step %s attempt %d [%s] %s\n", e.At.Local().Format(time.DateTime), p(e.Step), e.Attempt, p(e.Kind), oneLine(e.Error, 200))
	}
	for _, s := range d.Signals {
		consumed := "pending"
		if s.ConsumedAt != nil {
			consumed = "consumed"
		}
		fmt.Fprintf(stdout, "signal   %d %s %s %s\n", s.ID, p(s.Name), consumed, oneLine(string(s.Payload), 80))
	}
	for _, k := range d.Children {
		fmt.Fprintf(stdout, "child    %d %s %s\n", k.ID, p(k.Machine), p(string(k.Status)))
	}
	return nil
}

// idCmd runs a command that acts on one instance id.
func idCmd(name string, act func(ctx context.Context, eng *gendurable.Engine, id int64, fs *flag.FlagSet) (string, error), extra func(fs *flag.FlagSet)) func(context.Context, []string, io.Writer, io.Writer) error {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(stderr)
		var c common
		c.register(fs)
		if extra != nil {
			extra(fs)
		}
		pos, err := parse(fs, args, "ID")
		if err != nil {
			return err
		}
		id, err := parseID(pos[0])
		if err != nil {
			return err
		}
		eng, done, err := c.engine(ctx)
		if err != nil {
			return err
		}
		defer done()
		msg, err := act(ctx, eng, id, fs)
		if err != nil {
			return err
		}
		if c.json {
			return printJSON(stdout, map[string]any{"id": id, "ok": true, "message": msg})
		}
		_, err = fmt.Fprintln(stdout, msg)
		return err
	}
}

var retryCmd = idCmd("retry", func(ctx context.Context, eng *gendurable.Engine, id int64, _ *flag.FlagSet) (string, error) {
	return fmt.Sprintf("instance %d is runnable again", id), eng.Retry(ctx, id)
}, nil)

var cancelReason string

var cancelCmd = idCmd("cancel", func(ctx context.Context, eng *gendurable.Engine, id int64, _ *flag.FlagSet) (string, error) {
	return fmt.Sprintf("instance %d cancelled", id), eng.Cancel(ctx, id, cancelReason)
}, func(fs *flag.FlagSet) {
	fs.StringVar(&cancelReason, "reason", "cancelled from the CLI", "recorded in the error history")
})

func signalCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("signal", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	payload := fs.String("payload", "", "JSON payload")
	dedup := fs.String("dedup-key", "", "dedup key: sending the same key twice is a no-op")
	pos, err := parse(fs, args, "ID", "NAME")
	if err != nil {
		return err
	}
	id, err := parseID(pos[0])
	if err != nil {
		return err
	}
	var p any
	if *payload != "" {
		if !json.Valid([]byte(*payload)) {
			return usageError{"--payload is not valid JSON"}
		}
		p = json.RawMessage(*payload)
	}
	eng, done, err := c.engine(ctx)
	if err != nil {
		return err
	}
	defer done()
	res, err := eng.Signal(ctx, id, pos[1], p, &gendurable.SignalOpts{DedupKey: *dedup})
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(stdout, res)
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
}

func pauseCmd(pause bool) func(context.Context, []string, io.Writer, io.Writer) error {
	name := map[bool]string{true: "pause", false: "resume"}[pause]
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(stderr)
		var c common
		c.register(fs)
		create := fs.Bool("create", false, "accept a queue that has no instance and no row yet (creates its row)")
		pos, err := parse(fs, args, "QUEUE")
		if err != nil {
			return err
		}
		eng, done, err := c.engine(ctx)
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
		_, err = fmt.Fprintf(stdout, "queue %s %sd\n", printable(pos[0]), name)
		return err
	}
}

// queueCmd is `queue remove NAME`: delete an empty queue's row.
func queueCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "remove" {
		return usageError{"queue takes: remove QUEUE"}
	}
	fs := flag.NewFlagSet("queue remove", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	pos, err := parse(fs, args[1:], "QUEUE")
	if err != nil {
		return err
	}
	eng, done, err := c.engine(ctx)
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
	_, err = fmt.Fprintf(stdout, "queue %s removed\n", printable(pos[0]))
	return err
}

func pruneCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	retention := fs.Duration("retention", gendurable.DefaultRetention, "delete instances finished longer ago than this")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	eng, done, err := c.engine(ctx)
	if err != nil {
		return err
	}
	defer done()
	var progress func(int64)
	if benchrun.IsTerminal(os.Stderr) {
		progress = func(n int64) { fmt.Fprintf(stderr, "\rpruned %d…", n) }
	}
	n, err := eng.Prune(ctx, *retention, progress)
	if progress != nil {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(stdout, map[string]any{"deleted": n, "retention": retention.String()})
	}
	_, err = fmt.Fprintf(stdout, "deleted %d instances finished more than %s ago\n", n, *retention)
	return err
}

func demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default DATABASE_URL; unset: a private throwaway PostgreSQL)")
	o := demo.Options{Out: stdout}
	fs.StringVar(&o.Schema, "schema", "gendurable_demo", "the demo's own schema: created, marked, recreated on every run; an existing schema the demo did not create is refused")
	fs.BoolVar(&o.ResetSchema, "reset-schema", false, "drop an existing --schema that the demo did not create, and everything in it (asks on a terminal)")
	yes := fs.Bool("yes", false, "do not ask before --reset-schema drops a schema")
	fs.IntVar(&o.Orders, "orders", 200, "checkouts to run")
	fs.IntVar(&o.Workers, "workers", 3, "engines working the queue")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	o.Confirm = confirmer(stderr, *yes)
	o.DatabaseURL = *dbURL
	if o.DatabaseURL == "" {
		o.DatabaseURL = os.Getenv("DATABASE_URL")
	}
	if f, ok := stdout.(*os.File); ok {
		o.Live = benchrun.IsTerminal(f)
	}
	_, err := demo.Run(ctx, o)
	return err
}

// exitCode maps an error to the CLI's exit codes.
func exitCode(err error) int {
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue), errors.Is(err, flag.ErrHelp), errors.Is(err, scratch.ErrNotScratch):
		return exitUsage
	case errors.Is(err, gendurable.ErrNotFound), errors.Is(err, gendurable.ErrUnknownQueue):
		return exitNotFound
	case errors.Is(err, gendurable.ErrNotRetryable), errors.Is(err, gendurable.ErrNotCancellable), errors.Is(err, gendurable.ErrQueueNotEmpty),
		errors.Is(err, gendurable.ErrUniqueConflict), errors.Is(err, gendurable.ErrInstanceFinished):
		return exitConflict
	case errors.Is(err, gendurable.ErrInvalidSignal), errors.Is(err, gendurable.ErrInvalidConfig),
		errors.Is(err, gendurable.ErrInvalidInput):
		return exitUsage
	}
	return exitError
}
