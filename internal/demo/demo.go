// Package demo is `gendurable demo`: an order checkout that awaits a
// payment signal with a timeout, fans out one shipment child per item and
// sends a receipt job, worked by several engines, with live progress and a
// summary. With no database given it runs on a private throwaway
// PostgreSQL started from the locally installed server binaries.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/display"
	"github.com/gendurable/gendurable/internal/pgtemp"
	"github.com/gendurable/gendurable/internal/pgurl"
	"github.com/gendurable/gendurable/internal/scratch"
	"github.com/gendurable/gendurable/internal/sqlq"
)

// Bounds of Options.Orders and Options.Workers: a demo, not a load test
// (the orders are built in memory at once, and each worker is an engine).
const (
	MaxOrders  = 100_000
	MaxWorkers = 64
)

// stallLimit is how long a run may go without an instance finishing
// before it fails; progressEvery how often a run whose output is not a
// terminal prints its counts.
const (
	stallLimit    = time.Minute
	progressEvery = 5 * time.Second
)

// Options configure a demo run.
type Options struct {
	DatabaseURL string // empty: a throwaway PostgreSQL
	// Schema is the demo's own schema, default "gendurable_demo": created and
	// marked by the demo, dropped and recreated on every run. An existing
	// schema the demo did not create is refused (scratch.ErrNotScratch)
	// unless ResetSchema.
	Schema      string
	ResetSchema bool                                // drop an existing schema the demo did not create
	Confirm     func(question string) (bool, error) // asked before such a drop, if set
	AuditLogger *slog.Logger                        // if set, gets a line when such a schema is dropped
	Orders      int                                 // default 200, at most MaxOrders
	Workers     int                                 // engines working the queues; default 3, at most MaxWorkers
	Out         io.Writer
	Live        bool // redraw a progress line (a terminal)
}

// Order is a checkout's state.
type Order struct {
	Number string   `json:"number"`
	Items  []string `json:"items"`
	Cents  int      `json:"cents,omitempty"`
	Note   string   `json:"note,omitempty"`
}

// Shipment is one child's arguments.
type Shipment struct {
	Order string `json:"order"`
	Item  string `json:"item"`
}

// Receipt is the receipt job's arguments.
type Receipt struct {
	Order string `json:"order"`
	Cents int    `json:"cents"`
}

// Summary is what a run did.
type Summary struct {
	Orders, Paid, TimedOut, Shipments, Receipts, Retries int
	// Failed: instances that ended failed — none in a demo left alone; an
	// operator's cancel during the run makes one.
	Failed int
	Took   time.Duration
}

func machines() (*gendurable.Machine[Order], *gendurable.Job[Shipment], *gendurable.Job[Receipt]) {
	ship := &gendurable.Job[Shipment]{
		Name: "ship_item", Backoff: func(int) time.Duration { return 50 * time.Millisecond },
		Perform: func(ctx context.Context, j *gendurable.Run[Shipment]) error {
			time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
			if rand.IntN(10) == 0 {
				return errors.New("carrier API timed out") // retried with backoff
			}
			return nil
		},
	}
	receipt := &gendurable.Job[Receipt]{
		Name:    "send_receipt",
		Perform: func(ctx context.Context, j *gendurable.Run[Receipt]) error { return nil },
	}
	checkout := &gendurable.Machine[Order]{
		Name: "checkout", Start: "await_payment",
		Steps: map[string]gendurable.StepFunc[Order]{
			"await_payment": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
				return r.Await("ship", r.State, "payment").Timeout(2 * time.Second), nil
			},
			"ship": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
				s := r.State
				payments := r.Awaited
				if len(payments) == 0 {
					// The timeout woke it; a payment sent since is in Inbox.
					payments = slices.DeleteFunc(slices.Clone(r.Inbox), func(s gendurable.Signal) bool { return s.Name != "payment" })
				}
				if len(payments) == 0 {
					s.Note = "payment timed out"
					return r.Next("close", s), nil
				}
				var p struct{ Cents int }
				if err := payments[0].Decode(&p); err != nil {
					return gendurable.Outcome{}, err
				}
				s.Cents = p.Cents
				kids := []gendurable.InsertParams{receipt.New(Receipt{Order: s.Number, Cents: s.Cents})}
				for _, item := range s.Items {
					kids = append(kids, ship.New(Shipment{Order: s.Number, Item: item}).With(gendurable.InsertOpts{
						UniqueKey: "ship:" + s.Number + ":" + item, PartitionKey: "warehouse-" + item[:1],
					}))
				}
				return r.ScheduleChildren("close", s, kids...), nil
			},
			"close": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
				return gendurable.Done(map[string]any{"children": len(r.Children), "note": r.State.Note}), nil
			},
		},
	}
	return checkout, ship, receipt
}

// Run runs the demo to completion.
func Run(ctx context.Context, o Options) (*Summary, error) {
	if o.Schema == "" {
		o.Schema = "gendurable_demo"
	}
	if o.Orders <= 0 {
		o.Orders = 200
	}
	if o.Workers <= 0 {
		o.Workers = 3
	}
	if o.Orders > MaxOrders || o.Workers > MaxWorkers {
		return nil, fmt.Errorf("demo: at most %d orders and %d workers", MaxOrders, MaxWorkers)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	url := o.DatabaseURL
	if url == "" {
		fmt.Fprintln(o.Out, "no database given: starting a private throwaway PostgreSQL…")
		srv, err := pgtemp.Start(ctx, pgtemp.Options{})
		if err != nil && ctx.Err() != nil {
			// Stopped while it started (Ctrl-C): nothing to install, and
			// initdb's last words are not the reason.
			return nil, fmt.Errorf("the throwaway PostgreSQL was stopped while it started: %w", context.Cause(ctx))
		}
		if err != nil {
			// pgtemp's error says what to install when the server is
			// missing; any other failure (postgres quoted) is not that.
			return nil, fmt.Errorf("start a throwaway PostgreSQL (or pass --database-url): %w", err)
		}
		defer func() { _ = srv.Stop() }()
		url = srv.URL()
		fmt.Fprintf(o.Out, "PostgreSQL is up at %s (removed on exit)\n", url)
	}
	// Each connection attempt bounded, as the CLI's (a server that accepts
	// and never answers held the demo, silent, for minutes).
	pool, err := pgurl.NewPool(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	// In use while the demo runs, from before its own drop: another demo
	// (or bench) started meanwhile refuses to drop the schema, without
	// touching its tables.
	hold, err := scratch.Use(ctx, pool, o.Schema)
	if err != nil {
		return nil, err
	}
	defer hold.Release()
	if err := scratch.Prepare(ctx, pool, o.Schema, scratch.Options{Owner: "demo", Reset: o.ResetSchema, Confirm: o.Confirm,
		Logger: o.AuditLogger, Hold: hold}); err != nil {
		return nil, err
	}
	if o.DatabaseURL != "" {
		// Where it writes, and that it stays: with DATABASE_URL exported on
		// a developer's machine, "the one command" wrote into that
		// database without a word (a newcomer's probe).
		cc := pool.Config().ConnConfig
		fmt.Fprintf(o.Out, "working in schema %q of database %q on %s:%d (kept afterwards: gendurable list --schema %s)\n",
			o.Schema, cc.Database, cc.Host, cc.Port, o.Schema)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	checkout, ship, receipt := machines() // shared by every engine
	var engines []*gendurable.Engine
	for i := 0; i < o.Workers; i++ {
		eng, err := gendurable.New(pool, &gendurable.Config{
			Schema: o.Schema, Machines: []gendurable.Definition{checkout, ship, receipt}, Logger: quiet,
			Queues:         map[string]gendurable.QueueConfig{"default": {Concurrency: 20, PollInterval: 50 * time.Millisecond, MaxPollInterval: 200 * time.Millisecond}},
			ReaperInterval: time.Second,
		})
		if err != nil {
			return nil, err
		}
		if err := eng.Start(ctx); err != nil {
			return nil, err
		}
		defer func() {
			// Bounded: with its tables dropped under it (`migrate down`
			// meanwhile), each outcome's write was retried for a lease,
			// batch after batch, and an unbounded Stop kept the demo alive,
			// deaf to SIGTERM, for minutes (a hostile operator's probe).
			sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
			defer cancel()
			_ = eng.Stop(sctx)
		}()
		engines = append(engines, eng)
	}
	eng := engines[0]
	start := time.Now()
	items := []string{"apple", "book", "cable", "desk", "easel"}
	ps := make([]gendurable.InsertParams, o.Orders)
	for i := range ps {
		n := 1 + rand.IntN(3)
		ps[i] = checkout.New(Order{Number: fmt.Sprintf("A-%04d", i+1), Items: items[i%3 : i%3+n]})
	}
	res, err := eng.InsertMany(ctx, ps)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Out, "inserted %s; %s; a payment provider pays 90%% of them (the rest time out after 2s)\n",
		display.Count(o.Orders, "checkout"), display.Count(o.Workers, "worker"))

	// The payment provider: pays most orders after a short while, sometimes
	// twice (the dedup key makes the second a no-op).
	var wg sync.WaitGroup
	var payErr error
	var mu sync.Mutex
	for i, r := range res {
		if i%10 == 9 {
			continue // never paid: times out
		}
		wg.Add(1)
		go func(id int64, i int) {
			defer wg.Done()
			time.Sleep(time.Duration(rand.IntN(1500)) * time.Millisecond)
			for range 1 + i%2 {
				// Sent again while the database is away (a restart): the
				// dedup key keeps a send whose answer was lost from
				// counting twice.
				var err error
				for try := 0; try < signalTries; try++ {
					_, err = eng.Signal(ctx, id, "payment", map[string]int{"Cents": 1000 + i}, &gendurable.SignalOpts{DedupKey: fmt.Sprintf("psp-%d", i)})
					if err == nil || errors.Is(err, gendurable.ErrInstanceFinished) || ctx.Err() != nil || !sqlq.ConnectionFailure(err) {
						break
					}
					time.Sleep(500 * time.Millisecond)
				}
				if err != nil && !errors.Is(err, gendurable.ErrInstanceFinished) {
					mu.Lock()
					payErr = err
					mu.Unlock()
				}
			}
		}(r.ID, i)
	}

	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	// The demo fails only when nothing finishes for stallLimit: how long a
	// run takes grows with --orders (each warehouse ships one item at a
	// time), and a fixed deadline failed runs that were working.
	var finished int64
	var printed string
	progressAt, printedAt := time.Now(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		qs, err := eng.Queues(ctx)
		if err != nil && ctx.Err() == nil && sqlq.ConnectionFailure(err) && time.Since(progressAt) <= stallLimit {
			// The database away for a moment (a restart, a failover): the
			// workers ride it out, and so does the progress line.
			continue
		}
		if err != nil {
			return nil, err
		}
		var c map[gendurable.Status]int64
		var total int64
		for _, q := range qs {
			c, total = q.ByStatus, q.Total
		}
		line := fmt.Sprintf("runnable %4d  executing %3d  awaiting payment %4d  awaiting shipments %4d  done %5d  failed %d",
			c[gendurable.StatusRunnable], c[gendurable.StatusExecuting], c[gendurable.StatusAwaitingSignal],
			c[gendurable.StatusAwaitingChildren], c[gendurable.StatusDone], c[gendurable.StatusFailed])
		if o.Live {
			fmt.Fprintf(o.Out, "\r%s", line)
		} else if time.Since(printedAt) >= progressEvery {
			fmt.Fprintln(o.Out, line) // not a terminal: a line now and then
			printed, printedAt = line, time.Now()
		}
		n := c[gendurable.StatusDone] + c[gendurable.StatusFailed]
		if n > finished {
			finished, progressAt = n, time.Now()
		}
		if n == total && total >= int64(o.Orders) {
			if o.Live {
				fmt.Fprintln(o.Out)
			} else if line != printed {
				fmt.Fprintln(o.Out, line) // the last state, unless just printed
			}
			break
		}
		if time.Since(progressAt) > stallLimit {
			if o.Live {
				fmt.Fprintln(o.Out)
			}
			return nil, fmt.Errorf("the demo stopped making progress: no instance finished for %s (%d of %d finished)",
				stallLimit, finished, total)
		}
	}
	wg.Wait()
	if payErr != nil {
		return nil, payErr
	}
	s := &Summary{Orders: o.Orders, Took: time.Since(start)}
	// A checkout counts as shipped only if its children all are: one
	// whose shipment an operator cancelled during the run still closes
	// done, and was counted "paid and shipped", the cancel a carrier
	// retry, the failed instance not named (a newcomer's probe).
	i := `"` + o.Schema + `".gendurable_instances`
	err = pool.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE fsm = 'checkout' AND result->>'note' = ''
		                   AND NOT EXISTS (SELECT 1 FROM `+i+` AS ch WHERE ch.parent_id = c.id AND ch.status <> 'done')),
		count(*) FILTER (WHERE fsm = 'checkout' AND result->>'note' <> ''),
		count(*) FILTER (WHERE fsm = 'ship_item' AND status = 'done'),
		count(*) FILTER (WHERE fsm = 'send_receipt' AND status = 'done'),
		coalesce(sum((SELECT count(*) FROM jsonb_array_elements(c.errors) AS e WHERE e->>'kind' = 'error')) FILTER (WHERE fsm = 'ship_item'), 0),
		count(*) FILTER (WHERE status = 'failed')
		FROM `+i+` AS c`).Scan(&s.Paid, &s.TimedOut, &s.Shipments, &s.Receipts, &s.Retries, &s.Failed)
	if err != nil {
		return nil, err
	}
	failed := ""
	if s.Failed > 0 {
		failed = fmt.Sprintf("; %s failed (gendurable list --status failed --schema %s)", display.Count(s.Failed, "instance"), o.Schema)
	}
	fmt.Fprintf(o.Out, "done in %s: %s paid and shipped (%s, %s, %s), %d timed out waiting for payment%s\n",
		s.Took.Round(100*time.Millisecond), display.Count(s.Paid, "checkout"), display.Count(s.Shipments, "shipment"), display.Count(s.Receipts, "receipt"),
		display.Count(s.Retries, "carrier retry"), s.TimedOut, failed)
	return s, nil
}

// stopTimeout bounds each engine's Stop when the demo ends: its steps are
// milliseconds long, and what is still unwritten after it is reaped.
const stopTimeout = 10 * time.Second

// signalTries bounds the payment provider's sends of one signal while the
// database is away (half a second apart).
const signalTries = 20

// The demo's machines: a demo schema holding instances of any other is not
// the demo's to drop (scratch.Share).
func init() {
	checkout, ship, receipt := machines()
	scratch.Share(checkout.Name, ship.Name, receipt.Name)
}
