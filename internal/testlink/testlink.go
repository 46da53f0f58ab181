// Package testlink lets package gendurabletest reach the root package's
// unexported machinery — run one step through the engine's own code path,
// read a machine's rows through the engine's pool — without widening the
// root package's API. The root package fills in the functions when it is
// initialised; gendurabletest imports the root package, so they are always
// set by the time it calls them.
//
// Values of root types travel as any (this package cannot import the root
// package, which imports it).
package testlink

import (
	"context"
	"encoding/json"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5"
)

// Def is what gendurabletest needs to know of a machine or job.
type Def struct {
	Name        string
	Version     int
	Queue       string
	Steps       []string // sorted
	MaxAttempts int
	ReadsInbox  bool
}

// Signal is one signal of a step's inbox.
type Signal struct {
	ID      int64
	Name    string
	Payload json.RawMessage
	At      time.Time
}

// StepInput is one step run: the claim as the pick would have returned it.
type StepInput struct {
	Claim    sqlq.Claimed
	Queue    string
	Children []sqlq.ChildRow
	// Registered, when non-nil, are the definitions (*Machine[S], *Job[T])
	// a child may be an instance of; nil accepts any valid definition.
	Registered []any
}

// StepOutput is what the engine would write for the step, and the WithTx
// callback it would run in the outcome's transaction.
type StepOutput struct {
	Out     sqlq.Outcome
	StepErr error
	TxFn    func(ctx context.Context, tx pgx.Tx) error
	// Handle runs the failure path for an error of TxFn (as the engine does
	// when a WithTx callback fails) and returns what it would write instead.
	Handle func(ctx context.Context, err error) StepOutput
	// Rejected says why PostgreSQL would refuse Out ("" if it would not):
	// a state or result jsonb cannot store. The engine then fails the
	// instance at once (error kind outcome_rejected).
	Rejected string
}

// Set by the root package at init.
var (
	// Describe returns the definition of def (a *Machine[S] or *Job[T]),
	// or its configuration error.
	Describe func(def any) (Def, error)
	// RunStep runs in.Claim.Step of def under its StepTimeout, with its
	// Handle on failure, and encodes the outcome as the engine would.
	RunStep func(ctx context.Context, def any, in StepInput) (StepOutput, error)
	// Instances reads up to limit instances of def's machine and version,
	// newest first, through db (the engine's pool when db is nil), as
	// *gendurable.Instance values.
	Instances func(ctx context.Context, eng any, db sqlq.DB, def any, limit int) ([]any, error)
)
