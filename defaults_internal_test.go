package gendurable

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The defaults the godoc of Config, QueueConfig, KeyPolicy, Machine and Job
// states — and README.md's "Configuration" section repeats — written out as
// the documents say them, not through the Default* constants: changing a
// default without its documentation (or the reverse) fails here.

func defaultsPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	// New does not touch the database; nothing connects to this address.
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

type defaultCase struct {
	name      string
	got, want any
}

func checkDefaults(t *testing.T, cases []defaultCase) {
	t.Helper()
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s: New applied %v, the documentation says %v", c.name, c.got, c.want)
		}
	}
}

func TestDocumentedConfigDefaults(t *testing.T) {
	t.Parallel()
	e, err := New(defaultsPool(t), &Config{
		Queues:      map[string]QueueConfig{"default": {}},
		KeyPolicies: []KeyPolicy{{Prefix: "rated:", Limit: 2, Rate: 7}, {Prefix: "plain:", Limit: 3}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := e.Config()
	q := c.Queues["default"]
	checkDefaults(t, []defaultCase{
		{"Schema", c.Schema, "public"},
		{"LeaseDuration", c.LeaseDuration, 60 * time.Second},
		{"HeartbeatInterval", c.HeartbeatInterval, 20 * time.Second},
		{"ReaperInterval", c.ReaperInterval, 30 * time.Second},
		{"AwaitTimeoutInterval (zero: follows ReaperInterval)", c.AwaitTimeoutInterval, time.Duration(0)},
		{"DrainTimeout", c.DrainTimeout, 10 * time.Second},
		{"TxIdleTimeout (the lease)", c.TxIdleTimeout, 60 * time.Second},
		{"UnknownVersionDelay", c.UnknownVersionDelay, 30 * time.Second},
		{"MaxStateBytes (1 MiB)", c.MaxStateBytes, 1 << 20},
		{"MaxSignalBytes (256 KiB)", c.MaxSignalBytes, 256 << 10},
		{"MaxJSONDepth", c.MaxJSONDepth, 1000},
		{"Retention (7 days)", c.Retention, 7 * 24 * time.Hour},
		{"PruneInterval", c.PruneInterval, time.Hour},
		{"MaintenanceTimeout (max(lease, 30s))", c.MaintenanceTimeout, 60 * time.Second},
		{"CommitConcurrency", c.CommitConcurrency, 2},
		{"Logger", c.Logger, slog.Default()},

		{"QueueConfig.Concurrency", q.Concurrency, 10},
		{"QueueConfig.Prefetch (= Concurrency)", q.Prefetch, 10},
		{"QueueConfig.MinDemand", q.MinDemand, 1},
		{"QueueConfig.BusyPollInterval", q.BusyPollInterval, 25 * time.Millisecond},
		{"QueueConfig.PollInterval", q.PollInterval, time.Second},
		{"QueueConfig.MaxPollInterval", q.MaxPollInterval, 5 * time.Second},
		{"QueueConfig.GlobalConcurrency (none)", q.GlobalConcurrency, 0},
		{"QueueConfig.ChainSteps", q.ChainSteps, 16},

		{"KeyPolicy.Per (with a Rate)", c.KeyPolicies[0].Per, time.Second},
		{"KeyPolicy.Burst (with a Rate: Rate)", c.KeyPolicies[0].Burst, 7},
		{"KeyPolicy.Per (without a Rate)", c.KeyPolicies[1].Per, time.Duration(0)},
		{"KeyPolicy.Burst (without a Rate)", c.KeyPolicies[1].Burst, 0},
	})
}

// The defaults that follow other settings, as documented.
func TestDocumentedDerivedDefaults(t *testing.T) {
	t.Parallel()
	e, err := New(defaultsPool(t), &Config{
		LeaseDuration:     3 * time.Second,
		CommitConcurrency: -1,
		Queues: map[string]QueueConfig{
			"fastpoll":  {PollInterval: 10 * time.Millisecond},
			"slowpoll":  {PollInterval: 10 * time.Second},
			"none":      {Concurrency: 4, Prefetch: -1, ChainSteps: -1},
			"set":       {Concurrency: 4, Prefetch: 2},
			"global":    {Concurrency: 4, GlobalConcurrency: 8},
			"globalset": {Concurrency: 4, GlobalConcurrency: 8, Prefetch: 3},
			"maxonly":   {MaxPollInterval: 200 * time.Millisecond},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := e.Config()
	checkDefaults(t, []defaultCase{
		{"HeartbeatInterval (LeaseDuration/3 if shorter than 20s)", c.HeartbeatInterval, time.Second},
		{"TxIdleTimeout (the lease)", c.TxIdleTimeout, 3 * time.Second},
		{"MaintenanceTimeout (max(lease, 30s))", c.MaintenanceTimeout, 30 * time.Second},
		{"CommitConcurrency (negative: the default)", c.CommitConcurrency, 2},
		{"BusyPollInterval (PollInterval, if shorter than 25ms)", c.Queues["fastpoll"].BusyPollInterval, 10 * time.Millisecond},
		{"MaxPollInterval (5s with a short PollInterval)", c.Queues["fastpoll"].MaxPollInterval, 5 * time.Second},
		{"MaxPollInterval (PollInterval, if longer than 5s)", c.Queues["slowpoll"].MaxPollInterval, 10 * time.Second},
		{"BusyPollInterval (25ms with a long PollInterval)", c.Queues["slowpoll"].BusyPollInterval, 25 * time.Millisecond},
		{"Prefetch (negative: none, kept negative)", c.Queues["none"].Prefetch, -1},
		{"ChainSteps (negative: disabled, kept negative)", c.Queues["none"].ChainSteps, -1},
		{"Prefetch (none with a GlobalConcurrency)", c.Queues["global"].Prefetch, -1},
		{"Prefetch (set, with a GlobalConcurrency)", c.Queues["globalset"].Prefetch, 3},
		{"Prefetch (set)", c.Queues["set"].Prefetch, 2},
		{"PollInterval (MaxPollInterval, if set and shorter than 1s)", c.Queues["maxonly"].PollInterval, 200 * time.Millisecond},
	})
	// A configuration derived from Engine.Config keeps what it says: none
	// stayed 0 there before, which a New read as the default.
	e2, err := New(defaultsPool(t), &c)
	if err != nil {
		t.Fatal(err)
	}
	c2 := e2.Config()
	checkDefaults(t, []defaultCase{
		{"Prefetch (none, derived)", c2.Queues["none"].Prefetch, -1},
		{"ChainSteps (disabled, derived)", c2.Queues["none"].ChainSteps, -1},
		{"Prefetch (none with a GlobalConcurrency, derived)", c2.Queues["global"].Prefetch, -1},
		{"Prefetch (set, derived)", c2.Queues["set"].Prefetch, 2},
	})
}

func TestDocumentedMachineAndJobDefaults(t *testing.T) {
	t.Parallel()
	m := &Machine[struct{}]{Name: "m", Start: "a", Steps: map[string]StepFunc[struct{}]{
		"a": func(context.Context, *Run[struct{}]) (Outcome, error) { return Done(nil), nil },
	}}
	j := &Job[struct{}]{Name: "j", Perform: func(context.Context, *Run[struct{}]) error { return nil }}
	mc, err := m.definition()
	if err != nil {
		t.Fatal(err)
	}
	jc, err := j.definition()
	if err != nil {
		t.Fatal(err)
	}
	checkDefaults(t, []defaultCase{
		{"Machine.Version", mc.version, 1},
		{"Machine.Queue", mc.queue, "default"},
		{"Machine.MaxAttempts", mc.maxAttempts, 20},
		{"Machine.StepTimeout (none)", mc.stepTimeout, time.Duration(0)},
		{"Job.Version", jc.version, 1},
		{"Job.Queue", jc.queue, "default"},
		{"Job.MaxAttempts", jc.maxAttempts, 20},
		{"Job.Timeout (none)", jc.stepTimeout, time.Duration(0)},
		{"Job step name", jc.start, "perform"},
	})
	// DefaultBackoff: 1s·2^attempt, capped at one hour, with up to 50%
	// jitter subtracted.
	for attempt, full := range map[int]time.Duration{
		-1: time.Second, 0: time.Second, 1: 2 * time.Second, 5: 32 * time.Second,
		11: 2048 * time.Second, 12: time.Hour, 1000: time.Hour,
	} {
		for range 50 {
			if d := DefaultBackoff(attempt); d < full/2 || d > full {
				t.Fatalf("DefaultBackoff(%d) = %s, want within [%s, %s]", attempt, d, full/2, full)
			}
		}
	}
}
