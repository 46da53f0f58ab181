// Command quickstart shows gendurable's guarantee end to end: it inserts
// three-step order machines and jobs, works them with two worker processes,
// kills one with SIGKILL in the middle, and waits until every instance has
// still finished.
//
//	go run ./examples/quickstart            # the whole demo
//	go run ./examples/quickstart work       # one worker, until Ctrl-C
//	go run ./examples/quickstart insert -n 500
//	go run ./examples/quickstart status
//
// The database is DATABASE_URL. Without it, the demo starts a private
// throwaway PostgreSQL from the locally installed server binaries (removed on
// exit); the work, insert and status commands need DATABASE_URL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/gorun"
	"github.com/gendurable/gendurable/internal/pgtemp"
	"github.com/gendurable/gendurable/internal/pgurl"
	"github.com/gendurable/gendurable/internal/scratch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Order is the state of one order machine, stored as JSON in its row.
type Order struct {
	Item     string `json:"item"`
	Reserved bool   `json:"reserved"`
	Charged  bool   `json:"charged"`
}

// OrderMachine: reserve → charge → ship. Charging fails now and then; the
// default Handle retries it with backoff.
var OrderMachine = &gendurable.Machine[Order]{
	Name:    "order",
	Start:   "reserve",
	Backoff: func(int) time.Duration { return 100 * time.Millisecond },
	Steps: map[string]gendurable.StepFunc[Order]{
		"reserve": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
			work(ctx)
			s := r.State
			s.Reserved = true
			return r.Next("charge", s), nil
		},
		"charge": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
			work(ctx)
			if rand.IntN(10) == 0 {
				return gendurable.Outcome{}, errors.New("payment provider timed out")
			}
			s := r.State
			s.Charged = true
			return r.Next("ship", s), nil
		},
		"ship": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
			work(ctx)
			return gendurable.Done(map[string]string{"shipped": r.State.Item}), nil
		},
	},
}

// Receipt is a job's arguments.
type Receipt struct {
	Email string `json:"email"`
}

// ReceiptJob is a one-step job.
var ReceiptJob = &gendurable.Job[Receipt]{
	Name: "send_receipt",
	Perform: func(ctx context.Context, j *gendurable.Run[Receipt]) error {
		work(ctx)
		return nil
	},
}

// work stands in for a real side effect: 10–40 ms.
func work(ctx context.Context) {
	select {
	case <-time.After(time.Duration(10+rand.IntN(30)) * time.Millisecond):
	case <-ctx.Done():
	}
}

const schema = "quickstart"

const usage = `quickstart shows gendurable's guarantee end to end: orders and jobs worked by
two worker processes, one of them killed with SIGKILL in the middle.

  go run ./examples/quickstart                 the whole demo (-n N: orders, and as many jobs; default 400)
  go run ./examples/quickstart work            one worker, until Ctrl-C
  go run ./examples/quickstart insert -n 500   insert orders and jobs
  go run ./examples/quickstart status          counts by status

The database is DATABASE_URL (schema quickstart, created and marked by it). Without it,
the demo starts a private throwaway PostgreSQL; work, insert and status need DATABASE_URL.
`

// maxOrders bounds -n.
const maxOrders = 100000

func main() {
	cmd, args := "demo", os.Args[1:]
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:] // else flags of the demo (-n 100, --help)
	}
	if cmd == "help" {
		fmt.Print(usage)
		return
	}
	fs := flag.NewFlagSet(cmd, flag.ExitOnError) // -h, --help: usage, exit 0
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage) }
	n := fs.Int("n", 400, "orders (and as many jobs) to insert, 1..100000")
	_ = fs.Parse(args)
	if (cmd == "demo" || cmd == "insert") && (*n < 1 || *n > maxOrders) {
		// As `gendurable demo --orders` does: a bound the machine can hold
		// (each order is two rows of one InsertMany).
		fmt.Fprintf(os.Stderr, "quickstart: -n must be within 1..%d, not %d\n", maxOrders, *n)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// `go run ./examples/quickstart` stopped with SIGTERM exits without
	// passing it on: the quickstart stops (its workers with it) when the go
	// command is gone.
	ctx, unwatch := gorun.Watch(ctx)
	defer unwatch()
	switch cmd {
	case "demo", "work", "insert", "status":
	default:
		// A usage error, exit 2, as the -n bound's (it was exit 1).
		fmt.Fprintf(os.Stderr, "quickstart: unknown command %q (demo, work, insert, status; --help shows the usage)\n", cmd)
		os.Exit(2)
	}
	var err error
	switch cmd {
	case "demo":
		err = demo(ctx, *n)
	case "work":
		err = withPool(ctx, func(pool *pgxpool.Pool) error { return runWorker(ctx, pool) })
	case "insert":
		err = withPool(ctx, func(pool *pgxpool.Pool) error { return insert(ctx, pool, *n) })
	case "status":
		err = withPool(ctx, func(pool *pgxpool.Pool) error { _, _, _, err := printStatus(ctx, pool); return err })
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = fmt.Errorf("stopped: %v", context.Cause(ctx)) // Ctrl-C, SIGTERM
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		if errors.Is(err, scratch.ErrNotScratch) {
			os.Exit(2) // as `gendurable demo` does: a schema it will not touch
		}
		os.Exit(1)
	}
}

func withPool(ctx context.Context, fn func(*pgxpool.Pool) error) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres)")
	}
	pool, err := pgurl.NewPool(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The schema the demo uses too: created and marked if missing, kept
	// (with the instances in it) if marked, refused if someone else's.
	// Held while the command runs: a demo run started meanwhile refuses to
	// drop the schema under this one (scratch.Use).
	hold, err := scratch.Ensure(ctx, pool, schema, scratchOptions)
	if err != nil {
		return err
	}
	defer hold.Release()
	return fn(pool)
}

// The quickstart's machines: a schema of its own holding instances of any
// other is not its to drop (scratch.Share).
func init() { scratch.Share(OrderMachine.Name, ReceiptJob.Name) }

// scratchOptions mark the quickstart's schema as its own; the remedy for one
// it did not create names what this program offers (no flags).
var scratchOptions = scratch.Options{
	Owner:  "quickstart",
	Remedy: "nothing was changed: drop it yourself if it is a leftover (DROP SCHEMA " + schema + " CASCADE), or " + throwaway,
	// A schema holding someone's objects: no DROP SCHEMA … CASCADE advised.
	ForeignRemedy: "nothing was changed: move them out of schema " + schema + ", or " + throwaway,
}

const throwaway = "unset DATABASE_URL to run the quickstart against a throwaway PostgreSQL"

func newEngine(pool *pgxpool.Pool, logger *slog.Logger) (*gendurable.Engine, error) {
	return gendurable.New(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Definition{OrderMachine, ReceiptJob},
		Queues:   map[string]gendurable.QueueConfig{"default": {Concurrency: 10, PollInterval: 100 * time.Millisecond}},
		// Short leases so that a killed worker's steps come back within seconds.
		LeaseDuration: 3 * time.Second, HeartbeatInterval: time.Second, ReaperInterval: time.Second,
		Logger: logger,
	})
}

// runWorker works the queue until ctx is cancelled, then drains.
func runWorker(ctx context.Context, pool *pgxpool.Pool) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	eng, err := newEngine(pool, logger)
	if err != nil {
		return err
	}
	if err := eng.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return eng.Stop(stopCtx)
}

func insert(ctx context.Context, pool *pgxpool.Pool, n int) error {
	eng, err := newEngine(pool, slog.Default())
	if err != nil {
		return err
	}
	ps := make([]gendurable.InsertParams, 0, 2*n)
	for i := range n {
		ps = append(ps,
			OrderMachine.New(Order{Item: fmt.Sprintf("book-%d", i)}),
			ReceiptJob.New(Receipt{Email: fmt.Sprintf("buyer%d@example.com", i)}))
	}
	if _, err := eng.InsertMany(ctx, ps); err != nil {
		return err
	}
	fmt.Printf("inserted %d orders and %d jobs\n", n, n)
	return nil
}

// printStatus prints the instance counts by status and returns how many are
// not finished.
func printStatus(ctx context.Context, pool *pgxpool.Pool) (left, done, recovered int, err error) {
	var runnable, executing, failed, retried int
	err = pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'runnable'),
		       count(*) FILTER (WHERE status = 'executing'),
		       count(*) FILTER (WHERE status = 'done'),
		       count(*) FILTER (WHERE status = 'failed'),
		       count(*) FILTER (WHERE errors @> '[{"kind":"lease_expired"}]')
		FROM quickstart.gendurable_instances`).Scan(&runnable, &executing, &done, &failed, &retried)
	if err != nil {
		return 0, 0, 0, err
	}
	fmt.Printf("runnable %5d  executing %4d  done %5d  failed %d  recovered from the crash %d\n",
		runnable, executing, done, failed, retried)
	return runnable + executing, done, retried, nil
}

func demo(ctx context.Context, n int) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		fmt.Println("DATABASE_URL is not set: starting a private throwaway PostgreSQL…")
		srv, err := pgtemp.Start(ctx, pgtemp.Options{})
		if err != nil {
			return fmt.Errorf("start a throwaway PostgreSQL (install postgresql, or set DATABASE_URL): %w", err)
		}
		defer func() { _ = srv.Stop() }()
		url = srv.URL()
	}
	pool, err := pgurl.NewPool(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	// A clean slate each run, in a schema of the demo's own: it is marked
	// when created, and one the demo did not create (it may hold someone's
	// data) is left alone; one a worker or another demo is running in is
	// refused (held from before the drop until this demo ends).
	hold, err := scratch.Use(ctx, pool, schema)
	if err != nil {
		return err
	}
	defer hold.Release()
	opts := scratchOptions
	opts.Hold = hold
	if err := scratch.Prepare(ctx, pool, schema, opts); err != nil {
		return err
	}
	if err := insert(ctx, pool, n); err != nil {
		return err
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	var workers []*worker
	for i := range 2 {
		// Not exec.CommandContext: its cancel (Ctrl-C, SIGTERM) is a
		// SIGKILL, and the workers are to stop cleanly (SIGTERM, below),
		// as the README says a worker does; only the demonstration's
		// victim is killed. On Linux, a parent-death SIGTERM stops them
		// cleanly too when the demo itself is killed (kill -9, the OOM
		// killer): before, they went on running, orphaned, polling the
		// throwaway server that died with the demo (a newcomer's probe).
		w := exec.Command(self, "work")
		w.Env = append(os.Environ(), "DATABASE_URL="+url)
		w.Stdout, w.Stderr = os.Stdout, os.Stderr
		p, err := startWorker(w)
		if err != nil {
			return err
		}
		fmt.Printf("started worker %d (pid %d)\n", i+1, w.Process.Pid)
		workers = append(workers, p)
	}
	defer func() {
		for _, w := range workers {
			_ = w.cmd.Process.Signal(syscall.SIGTERM)
			<-w.done
		}
	}()

	killed, done := false, 0
	start := time.Now()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		// In the middle of its steps: once some have finished (a worker
		// process starting slowly on a loaded machine had run none at one
		// second: the kill then interrupted nothing — a newcomer's probe).
		if !killed && time.Since(start) > time.Second && (done > 0 || time.Since(start) > 10*time.Second) {
			victim := workers[0]
			fmt.Printf("kill -9 worker 1 (pid %d) in the middle of its steps\n", victim.cmd.Process.Pid)
			_ = victim.cmd.Process.Signal(syscall.SIGKILL)
			<-victim.done
			workers = workers[1:]
			killed = true
		}
		left, d, recovered, err := printStatus(ctx, pool)
		if err != nil {
			return err
		}
		done = d
		if left == 0 && killed {
			took := time.Since(start).Round(100 * time.Millisecond)
			if recovered == 0 {
				// The kill found no step of its worker's in flight (a
				// newcomer's probe: the line claimed a recovery of none).
				fmt.Printf("every instance finished in %s; the kill interrupted no step this time (none to recover): run it again to see one\n", took)
				return nil
			}
			fmt.Printf("every instance finished in %s despite the kill: committed steps were kept, the %d interrupted ones ran again\n",
				took, recovered)
			return nil
		}
		if time.Since(start) > 2*time.Minute {
			return errors.New("instances did not finish within 2 minutes")
		}
	}
}
