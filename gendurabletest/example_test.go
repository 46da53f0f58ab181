package gendurabletest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
)

// Invoice is the state of the invoice machine of the examples.
type Invoice struct {
	Customer string `json:"customer"`
	Cents    int    `json:"cents"`
	Sent     bool   `json:"sent,omitempty"`
}

var invoice = &gendurable.Machine[Invoice]{
	Name:  "invoice",
	Start: "send",
	Steps: map[string]gendurable.StepFunc[Invoice]{
		"send": func(ctx context.Context, r *gendurable.Run[Invoice]) (gendurable.Outcome, error) {
			if r.State.Cents <= 0 {
				return gendurable.Stop("nothing to invoice"), nil
			}
			s := r.State
			s.Sent = true
			return r.Await("settle", s, "paid").Timeout(14 * 24 * time.Hour), nil
		},
		"settle": func(ctx context.Context, r *gendurable.Run[Invoice]) (gendurable.Outcome, error) {
			if len(r.Awaited) == 0 {
				return r.Next("send", r.State).After(24 * time.Hour), nil // remind tomorrow
			}
			return gendurable.Done(map[string]int{"cents": r.State.Cents}), nil
		},
	},
}

// RunStep runs one step without a database and shows what the engine would
// write.
func ExampleRunStep() {
	t := exampleT() // in a test: the test's *testing.T
	defer t.end()
	ctx := context.Background()

	res := gendurabletest.RunStep(ctx, t, invoice, "send", Invoice{Customer: "ada", Cents: 4200}, nil)
	fmt.Println(res.Kind, res.Step, res.Awaits, res.Timeout, res.State.Sent)

	// Woken by the "paid" signal…
	res = gendurabletest.RunStep(ctx, t, invoice, "settle", res.State, &gendurabletest.StepOpts{
		Awaits: []string{"paid"},
		Inbox:  []gendurable.Signal{gendurabletest.NewSignal(t, "paid", nil)},
	})
	fmt.Println(res)

	// … or by the timeout.
	res = gendurabletest.RunStep(ctx, t, invoice, "settle", res.State, &gendurabletest.StepOpts{TimedOut: true})
	fmt.Println(res)
	// Output:
	// await settle [paid] 336h0m0s true
	// done {"cents":4200}
	// next "send" in 24h0m0s
}

// RequireInserted finds the instance an insert made, with its state typed.
func ExampleRequireInserted() {
	t := exampleT() // in a test: the test's *testing.T
	defer t.end()
	ctx := context.Background()
	db := gendurabletest.NewDB(t, nil)
	eng := db.NewEngine(t, &gendurable.Config{Machines: []gendurable.Definition{invoice}})

	// The code under test inserts an invoice.
	if _, err := eng.Insert(ctx, invoice.New(Invoice{Customer: "ada", Cents: 4200}).With(gendurable.InsertOpts{Priority: 1})); err != nil {
		panic(err)
	}

	got := gendurabletest.RequireInserted(ctx, t, eng, invoice, &gendurabletest.InsertedOpts[Invoice]{
		Priority: new(1),
		State:    func(s Invoice) bool { return s.Customer == "ada" },
	})
	fmt.Println(got.Step, got.Status, got.State.Cents)
	// Output:
	// send runnable 4200
}

// WorkUntilFinished works the engine until the instances finish.
func ExampleWorkUntilFinished() {
	t := exampleT() // in a test: the test's *testing.T
	defer t.end()
	ctx := context.Background()
	db := gendurabletest.NewDB(t, nil)
	eng := db.NewEngine(t, &gendurable.Config{
		Machines: []gendurable.Definition{invoice},
		Queues:   map[string]gendurable.QueueConfig{"default": {Concurrency: 2}},
	})
	empty, err := eng.Insert(ctx, invoice.New(Invoice{Customer: "bob"}))
	if err != nil {
		t.Fatalf("insert: %v", err)
	}

	ins := gendurabletest.WorkUntilFinished(ctx, t, eng, empty.ID)
	fmt.Println(ins[0].Status, ins[0].Errors[0].Error)
	// Output:
	// failed nothing to invoice
}
