package gendurable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Status is an instance's lifecycle status.
type Status string

// The statuses of an instance.
const (
	StatusRunnable         Status = "runnable"
	StatusExecuting        Status = "executing"
	StatusAwaitingSignal   Status = "awaiting_signal"
	StatusAwaitingChildren Status = "awaiting_children"
	StatusDone             Status = "done"
	StatusFailed           Status = "failed"
)

// Terminal reports whether the status is final (done or failed).
func (s Status) Terminal() bool { return s == StatusDone || s == StatusFailed }

// ErrNotFound: no instance has the given id.
var ErrNotFound = errors.New("gendurable: instance not found")

// StepError is one entry of an instance's error history.
type StepError struct {
	Step    string    `json:"step"`
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
	// Kind is "error", "panic", "stop", "lease_expired", "state_decode",
	// "outcome_rejected", "interrupted" or "infrastructure".
	Kind  string `json:"kind"`
	Error string `json:"error"`
}

// Instance is a snapshot of one instance row.
type Instance struct {
	ID             int64
	Machine        string
	Version        int
	Queue          string
	Step           string
	Status         Status
	State          json.RawMessage
	Result         json.RawMessage // set once done
	Priority       int
	Attempt        int
	MaxAttempts    int
	EligibleAt     time.Time
	LeaseExpiresAt *time.Time // set while executing
	PartitionKey   string
	Errors         []StepError // oldest first, the last 20
	ParentID       *int64
	InsertedAt     time.Time
	UpdatedAt      time.Time
	FinishedAt     *time.Time
}

// Instance reads one instance by id; [ErrNotFound] if there is none.
func (e *Engine) Instance(ctx context.Context, id int64) (*Instance, error) {
	r, err := e.q.GetInstance(ctx, e.pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("gendurable: read instance %d: %w", id, err)
	}
	in := &Instance{
		ID: r.ID, Machine: r.FSM, Version: int(r.Version), Queue: r.Queue, Step: r.Step,
		Status: Status(r.Status), State: r.State, Result: r.Result, Priority: int(r.Priority),
		Attempt: int(r.Attempt), MaxAttempts: int(r.MaxAttempts), EligibleAt: r.EligibleAt,
		LeaseExpiresAt: r.LeaseExpiresAt, ParentID: r.ParentID,
		InsertedAt: r.InsertedAt, UpdatedAt: r.UpdatedAt, FinishedAt: r.FinishedAt,
	}
	if r.PartitionKey != nil {
		in.PartitionKey = *r.PartitionKey
	}
	if err := json.Unmarshal(r.Errors, &in.Errors); err != nil {
		return nil, fmt.Errorf("gendurable: instance %d: error history: %w", id, err)
	}
	return in, nil
}

// ErrNotRetryable: only a failed instance can be retried.
var ErrNotRetryable = errors.New("gendurable: instance is not failed")

// ErrUniqueConflict: the operation would give an instance a unique key that
// another live instance holds.
var ErrUniqueConflict = errors.New("gendurable: unique key held by another instance")

// Retry moves a failed instance back to runnable at the step it failed in,
// with a fresh attempt budget; its error history is kept. A child whose
// parent still waits is waited for again. [ErrNotFound], [ErrNotRetryable]
// (not failed), or [ErrUniqueConflict] (another live instance now holds its
// unique key) leave everything unchanged.
func (e *Engine) Retry(ctx context.Context, id int64) error {
	status, queue, err := e.q.Retry(ctx, e.pool, id)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return fmt.Errorf("%w: instance %d: %s", ErrUniqueConflict, id, pgErr.Detail)
	}
	if err != nil {
		return fmt.Errorf("gendurable: retry %d: %w", id, err)
	}
	switch {
	case status == nil:
		return fmt.Errorf("%w: id %d", ErrNotFound, id)
	case queue == nil:
		return fmt.Errorf("%w: instance %d is %s", ErrNotRetryable, id, *status)
	}
	e.kickQueue(*queue)
	return nil
}
