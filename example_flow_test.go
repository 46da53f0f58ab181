package gendurable_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/gendurable/gendurable"
)

type Ticket struct {
	Urgent bool `json:"urgent"`
}

// ExampleMachine_ValidateOutcome declares a machine's transitions in Flow
// and checks a step's outcomes against them without a database, as a test
// would: a typo'd target is a *TransitionError, not a runtime retry loop.
func ExampleMachine_ValidateOutcome() {
	triage := func(ctx context.Context, r *gendurable.Run[Ticket]) (gendurable.Outcome, error) {
		if r.State.Urgent {
			return r.Next("escalte", r.State), nil // the typo
		}
		return r.Next("queue", r.State), nil
	}
	finish := func(ctx context.Context, r *gendurable.Run[Ticket]) (gendurable.Outcome, error) {
		return gendurable.Done(nil), nil
	}
	support := &gendurable.Machine[Ticket]{
		Name:  "support",
		Start: "triage",
		Steps: map[string]gendurable.StepFunc[Ticket]{"triage": triage, "escalate": finish, "queue": finish},
		Flow: []gendurable.FlowStep{
			{Step: "triage", To: []string{"escalate", "queue"}}, // moves on to one of these
			{Step: "escalate"}, // no To: finishes
			{Step: "queue"},
		},
	}
	for _, urgent := range []bool{false, true} {
		r := &gendurable.Run[Ticket]{Step: "triage", State: Ticket{Urgent: urgent}}
		out, _ := triage(context.Background(), r)
		err := support.ValidateOutcome("triage", out)
		var te *gendurable.TransitionError
		if errors.As(err, &te) {
			fmt.Printf("urgent=%v: %s to %q is not declared (allowed: %v)\n", urgent, te.Outcome, te.To, te.Allowed)
			continue
		}
		fmt.Printf("urgent=%v: %s ok (err %v)\n", urgent, out.Kind(), err)
	}
	// Output:
	// urgent=false: next ok (err <nil>)
	// urgent=true: next to "escalte" is not declared (allowed: [escalate queue])
}
