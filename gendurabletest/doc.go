// Package gendurabletest helps test code that uses gendurable: the machines
// and jobs themselves, and the code that inserts them.
//
// # Running a step without a database
//
// [RunStep] runs one step of a machine (or a job's Perform) for a state you
// give it and returns what the engine would write — the outcome's kind,
// next step, new state, delay, awaited names and timeout, children, Done
// result, Stop reason — through the engine's own code: the state goes
// through JSON as it does in the row, a failing or panicking step goes to
// the machine's Handle, and the outcome is checked against the machine.
// An outcome the engine would reject (a Next to a step the machine does
// not declare) fails the test. Signals and children are given in
// [StepOpts]:
//
//	func TestShipAfterPayment(t *testing.T) {
//		res := gendurabletest.RunStep(t.Context(), t, Checkout, "ship", CheckoutState{Items: []string{"book"}},
//			&gendurabletest.StepOpts{
//				Awaits: []string{"payment"},
//				Inbox:  []gendurable.Signal{gendurabletest.NewSignal(t, "payment", Payment{Cents: 4200})},
//			})
//		if res.Kind != "children" || len(res.Children) != 1 || res.State.Paid != 4200 {
//			t.Fatalf("ship: %s", res)
//		}
//	}
//
// # A database per test
//
// [NewDB] gives a test its own schema, migrated, and a small pool, and
// drops the schema when the test ends, so tests that use it may call
// t.Parallel. The server is $GENDURABLE_TEST_DATABASE_URL, else
// $DATABASE_URL; with neither set the test is skipped, saying so. The
// pools of one test binary hold at most $GENDURABLE_TEST_CONNS connections
// between them (default 24). [DB.NewEngine] builds an engine on the schema
// and stops it when the test ends.
//
// # Asserting inserts
//
// [RequireInserted] (through the engine's pool) and [RequireInsertedTx]
// (inside a transaction) fail the test unless exactly one instance of a
// machine matches — by queue, priority, step, status and a typed predicate
// on its state — and return it with its state decoded; the failure message
// lists what was inserted instead. [RequireNotInserted] is the converse.
//
// # Working instances to the end
//
// [WorkUntilFinished] works an engine until the given instances are done
// or failed and returns them; if they do not finish before the context or
// the test's deadline, it fails the test, saying for each what it waits
// for.
//
// A t.Fatal (t.FailNow, t.Skip, a testify require assertion) inside a step
// ends the test at once under [RunStep], which runs the step on the test's
// goroutine. Under a real engine's workers it cannot: in a test binary the
// engine runs each step on a goroutine of its own, and such a call fails
// that step like a panic (its error says runtime.Goexit was called) —
// record the failure with t.Error instead, or assert after the instance
// finished.
package gendurabletest
