package gendurable_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Signup is the state of the signup machine.
type Signup struct {
	Email    string `json:"email"`
	Verified bool   `json:"verified"`
}

// Example defines a three-step machine and a job, inserts one of each and
// works them to completion.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	// A schema of this run's own (two runs on one database do not meet),
	// removed at the end: Down drops the tables, then the empty schema goes.
	schema := fmt.Sprintf("example_machine_%d", os.Getpid())
	if _, err := migrate.Up(ctx, pool, schema); err != nil {
		panic(err)
	}
	defer func() {
		if _, err := migrate.Down(ctx, pool, schema); err == nil {
			_, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize())
		}
	}()

	signup := &gendurable.Machine[Signup]{
		Name:  "signup",
		Start: "create",
		Steps: map[string]gendurable.StepFunc[Signup]{
			"create": func(ctx context.Context, r *gendurable.Run[Signup]) (gendurable.Outcome, error) {
				fmt.Println("create account for", r.State.Email)
				return r.Next("verify", r.State), nil
			},
			"verify": func(ctx context.Context, r *gendurable.Run[Signup]) (gendurable.Outcome, error) {
				s := r.State
				s.Verified = true
				return r.Next("welcome", s), nil
			},
			"welcome": func(ctx context.Context, r *gendurable.Run[Signup]) (gendurable.Outcome, error) {
				fmt.Println("welcome", r.State.Email, "verified:", r.State.Verified)
				return gendurable.Done(nil), nil
			},
		},
	}
	type ping struct{ Msg string }
	pinger := &gendurable.Job[ping]{
		Name: "ping",
		Perform: func(ctx context.Context, j *gendurable.Run[ping]) error {
			fmt.Println("job says", j.State.Msg)
			return nil
		},
	}

	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Definition{signup, pinger},
		Queues:   map[string]gendurable.QueueConfig{"default": {Concurrency: 1}},
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
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

	m, err := eng.Insert(ctx, signup.New(Signup{Email: "ada@example.com"}))
	if err != nil {
		panic(err) // e.g. ErrUnknownMachine: signup missing from Config.Machines
	}
	if _, err := gendurable.WaitResult[any](ctx, eng, m.ID); err != nil {
		panic(err)
	}
	j, err := eng.Insert(ctx, pinger.New(ping{Msg: "pong"}))
	if err != nil {
		panic(err)
	}
	if _, err := gendurable.WaitResult[any](ctx, eng, j.ID); err != nil {
		panic(err)
	}
	// Output:
	// create account for ada@example.com
	// welcome ada@example.com verified: true
	// job says pong
}
