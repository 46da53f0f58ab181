package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Checkout is the state of one order's checkout.
type Checkout struct {
	Order string   `json:"order"`
	Items []string `json:"items"`
	Paid  int      `json:"paid,omitempty"`
}

// Payment is the payload of the "payment" signal.
type Payment struct {
	Cents int `json:"cents"`
}

// Shipment is the argument of one shipment child job.
type Shipment struct {
	Order string `json:"order"`
	Item  string `json:"item"`
}

// Example_checkout: an order checkout that awaits payment with a timeout,
// then fans out one shipment child per item and finishes when all shipped.
func Example_checkout() {
	ship := &gendurable.Job[Shipment]{
		Name: "ship_item",
		Perform: func(ctx context.Context, j *gendurable.Run[Shipment]) error {
			return nil // call the carrier here; a retry must be harmless
		},
	}
	checkout := &gendurable.Machine[Checkout]{
		Name:  "checkout",
		Start: "await_payment",
		Steps: map[string]gendurable.StepFunc[Checkout]{
			// Park until a "payment" signal arrives, for at most 300ms.
			"await_payment": func(ctx context.Context, r *gendurable.Run[Checkout]) (gendurable.Outcome, error) {
				return r.Await("ship", r.State, "payment").Timeout(300 * time.Millisecond), nil
			},
			// Woken by the payment, or by the timeout (nothing awaited).
			"ship": func(ctx context.Context, r *gendurable.Run[Checkout]) (gendurable.Outcome, error) {
				payments := r.Awaited
				if len(payments) == 0 {
					// The timeout woke it; a payment sent since is in Inbox.
					payments = slices.DeleteFunc(slices.Clone(r.Inbox), func(s gendurable.Signal) bool { return s.Name != "payment" })
				}
				if len(payments) == 0 {
					return gendurable.Stop("payment timed out"), nil
				}
				var p Payment
				if err := payments[0].Decode(&p); err != nil {
					return gendurable.Outcome{}, err
				}
				s := r.State
				s.Paid = p.Cents
				var shipments []gendurable.InsertParams
				for _, item := range s.Items {
					shipments = append(shipments, ship.New(Shipment{Order: s.Order, Item: item}).With(gendurable.InsertOpts{
						UniqueKey:    "ship:" + s.Order + ":" + item, // a rerun of this step adds no duplicate
						PartitionKey: "warehouse-1",                  // one shipment at a time per warehouse
					}))
				}
				return r.ScheduleChildren("complete", s, shipments...), nil
			},
			// Runs once, after the last shipment finished.
			"complete": func(ctx context.Context, r *gendurable.Run[Checkout]) (gendurable.Outcome, error) {
				shipped := 0
				for _, c := range r.Children {
					if c.Status == gendurable.StatusDone {
						shipped++
					}
				}
				return gendurable.Done(map[string]int{"paid": r.State.Paid, "shipped": shipped}), nil
			},
		},
	}

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	// A schema of this run's own (two runs on one database do not meet),
	// removed at the end: Down drops the tables, then the empty schema goes.
	schema := fmt.Sprintf("example_checkout_%d", os.Getpid())
	if _, err := migrate.Up(ctx, pool, schema); err != nil {
		panic(err)
	}
	defer func() {
		if _, err := migrate.Down(ctx, pool, schema); err == nil {
			_, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize())
		}
	}()
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Definition{checkout, ship},
		Queues:   map[string]gendurable.QueueConfig{"default": {Concurrency: 4, PollInterval: 20 * time.Millisecond}},
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		panic(err)
	}
	if err := eng.Start(ctx); err != nil {
		panic(err)
	}
	defer func() {
		// Bounded: a step that ignores its cancellation cannot hold the exit.
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = eng.Stop(sctx)
	}()

	// Check every insert's error: an unregistered machine or an invalid
	// option is refused, and nothing is written.
	paid, err := eng.Insert(ctx, checkout.New(Checkout{Order: "A-1", Items: []string{"book", "lamp"}}))
	if err != nil {
		panic(err)
	}
	late, err := eng.Insert(ctx, checkout.New(Checkout{Order: "A-2", Items: []string{"pen"}}))
	if err != nil {
		panic(err)
	}

	for !parked(ctx, eng, paid.ID) {
		time.Sleep(10 * time.Millisecond)
	}
	w, _ := eng.WaitReason(ctx, paid.ID)
	fmt.Println("A-1:", w.Summary[:len("awaiting signal payment")])
	if _, err := eng.Signal(ctx, paid.ID, "payment", Payment{Cents: 4200}, &gendurable.SignalOpts{DedupKey: "psp-event-981"}); err != nil {
		panic(err)
	}

	result, err := gendurable.WaitResult[map[string]int](ctx, eng, paid.ID)
	fmt.Println("A-1:", result, err)
	_, err = gendurable.WaitResult[map[string]int](ctx, eng, late.ID)
	var failed *gendurable.FailedError
	if errors.As(err, &failed) {
		fmt.Println("A-2: failed at", failed.Step+":", failed.Reason)
	}
	// Output:
	// A-1: awaiting signal payment
	// A-1: map[paid:4200 shipped:2] <nil>
	// A-2: failed at ship: payment timed out
}

func parked(ctx context.Context, eng *gendurable.Engine, id int64) bool {
	in, err := eng.Instance(ctx, id)
	return err == nil && in.Status == gendurable.StatusAwaitingSignal
}
