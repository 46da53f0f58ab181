package gendurable_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"math"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/gendurable/gendurable/internal/childproc"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"
	"github.com/stretchr/testify/require"
)

// nilHook is a Hook whose nil pointer a constructor might return with its
// error.
type nilHook struct{}

func (*nilHook) OnEvent(context.Context, gendurable.Event) {}

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	ok := &gendurable.Job[orderArgs]{Name: "ok", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	okV1Again := &gendurable.Job[orderArgs]{Name: "ok", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	cases := []struct {
		name string
		cfg  gendurable.Config
		want string
	}{
		{"heartbeat too slow for lease", gendurable.Config{LeaseDuration: time.Second, HeartbeatInterval: time.Second}, "exceeds LeaseDuration / 3"},
		// × 3 overflowed past the check (a hostile probe: its claims were
		// lost before every step).
		{"heartbeat past a third of a Duration", gendurable.Config{LeaseDuration: 2 * time.Second, HeartbeatInterval: 1 << 62}, "exceeds LeaseDuration / 3"},
		{"typed nil hook", gendurable.Config{Hooks: []gendurable.Hook{(*nilHook)(nil)}}, "Hooks[0] is nil"},
		{"a goroutine per place", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 1<<16 + 1, Prefetch: -1}}}, "Concurrency 65537 above 65536"},
		{"negative lease", gendurable.Config{LeaseDuration: -time.Second}, "negative"},
		{"bad schema", gendurable.Config{Schema: `x"; DROP TABLE y; --`}, "invalid schema name"},
		{"schema too long", gendurable.Config{Schema: strings.Repeat("s", 64)}, "invalid schema name"},
		{"nil machine", gendurable.Config{Machines: []gendurable.Definition{nil}}, "nil entry"},
		{"duplicate registration", gendurable.Config{Machines: []gendurable.Definition{ok, okV1Again}}, "registered twice"},
		{"no steps", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Machine[orderArgs]{Name: "m", Start: "a"}}}, "declares no Steps"},
		{"unnamed", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Machine[orderArgs]{Start: "a"}}}, `machine Name "" is empty`},
		{"start not a step", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Machine[orderArgs]{
			Name: "m", Start: "zzz",
			Steps: map[string]gendurable.StepFunc[orderArgs]{"a": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			}},
		}}}, `Start step "zzz" is not one of its Steps [a]`},
		{"version beyond int", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Job[orderArgs]{Name: "j", Version: math.MaxInt32 + 1,
			Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}}}, "Version 2147483648 is more than 2147483647"},
		{"max attempts beyond int", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Job[orderArgs]{Name: "j", MaxAttempts: math.MaxInt32 + 1,
			Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}}}, "MaxAttempts 2147483648 is more than 2147483647"},
		{"job without perform", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Job[orderArgs]{Name: "j"}}}, "no Perform"},
		{"negative concurrency", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: -1}}}, "negative Concurrency"},
		{"global concurrency beyond int4", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {GlobalConcurrency: math.MaxInt32 + 1}}}, "GlobalConcurrency 2147483648 above"},
		{"pick window beyond bound", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 10, Prefetch: 1 << 20}}}, "Concurrency + Prefetch (10 + 1048576) above"},
		{"pick window overflowing int", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 1, Prefetch: math.MaxInt}}}, "Concurrency + Prefetch (1 + 9223372036854775807) above"},
		{"typed nil machine", gendurable.Config{Machines: []gendurable.Definition{(*gendurable.Machine[orderArgs])(nil)}}, "nil *Machine[gendurable_test.orderArgs]"},
		{"typed nil job", gendurable.Config{Machines: []gendurable.Definition{(*gendurable.Job[orderArgs])(nil)}}, "nil *Job[gendurable_test.orderArgs]"},
		{"nil hook", gendurable.Config{Hooks: []gendurable.Hook{nil}}, "Hooks[0] is nil"},
		{"nil hook func", gendurable.Config{Hooks: []gendurable.Hook{gendurable.HookFunc(nil)}}, "Hooks[0] is nil"},
		{"reaper interval in nanoseconds", gendurable.Config{ReaperInterval: 30}, "ReaperInterval 30ns is below 1ms"},
		{"heartbeat in nanoseconds", gendurable.Config{HeartbeatInterval: 5}, "HeartbeatInterval 5ns is below 1ms"},
		{"drain timeout in nanoseconds", gendurable.Config{DrainTimeout: 30}, "DrainTimeout 30ns is below 1ms"},
		{"await sweep in nanoseconds", gendurable.Config{AwaitTimeoutInterval: 30}, "AwaitTimeoutInterval 30ns"},
		{"prune interval in nanoseconds", gendurable.Config{PruneInterval: 30}, "PruneInterval 30ns"},
		{"unknown version delay in nanoseconds", gendurable.Config{UnknownVersionDelay: 5}, "UnknownVersionDelay 5ns"},
		{"tx idle timeout in nanoseconds", gendurable.Config{TxIdleTimeout: 5}, "TxIdleTimeout 5ns"},
		{"retention in nanoseconds", gendurable.Config{Retention: 1}, "Retention 1ns is below 1s"},
		{"poll interval in nanoseconds", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {PollInterval: 30, BusyPollInterval: 30}}}, `queue "q": BusyPollInterval 30ns is below 1ms`},
		// Named as set: the unset BusyPollInterval defaults from it (a
		// promise probe was told of "BusyPollInterval 999µs").
		{"poll interval alone below the floor", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {PollInterval: 999 * time.Microsecond}}}, `queue "q": PollInterval 999µs is below 1ms`},
		{"max poll interval alone below the floor", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {MaxPollInterval: 999 * time.Microsecond}}}, `queue "q": MaxPollInterval 999µs is below 1ms`},
		{"rate above the burst bound with no burst", gendurable.Config{KeyPolicies: []gendurable.KeyPolicy{{Limit: 1, Rate: 1<<20 + 1}}}, "Rate 1048577 above 1048576 with no Burst"},
		{"step timeout in nanoseconds", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Job[orderArgs]{Name: "j", Timeout: 30,
			Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}}}, `job "j": Timeout 30ns is below 1ms`},
		{"job timeout negative", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Job[orderArgs]{Name: "j", Timeout: -1,
			Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}}}, `job "j": negative MaxAttempts or Timeout`},
		{"machine step timeout in nanoseconds", gendurable.Config{Machines: []gendurable.Definition{&gendurable.Machine[orderArgs]{Name: "m", StepTimeout: 30,
			Start: "a", Steps: map[string]gendurable.StepFunc[orderArgs]{"a": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			}}}}}, `machine "m": StepTimeout 30ns is below 1ms`},
		{"min demand too big", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {Concurrency: 2, Prefetch: -1, MinDemand: 3}}}, "MinDemand 3"},
		{"poll above max", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"q": {PollInterval: time.Minute, MaxPollInterval: time.Second}}}, "PollInterval"},
		{"empty queue name", gendurable.Config{Queues: map[string]gendurable.QueueConfig{"": {}}}, "queue name"},
		// A misuse probe's ceilings: a lease of math.MaxInt64 left a
		// crashed worker's rows unreaped for good; the others cannot be met.
		{"lease above a day", gendurable.Config{LeaseDuration: math.MaxInt64}, "LeaseDuration 2562047h47m16.854775807s above 24h0m0s"},
		{"state bytes past jsonb", gendurable.Config{MaxStateBytes: math.MaxInt}, "above 268435455 bytes, the most a PostgreSQL jsonb holds"},
		{"signal bytes past jsonb", gendurable.Config{MaxSignalBytes: 1 << 28}, "above 268435455 bytes, the most a PostgreSQL jsonb holds"},
		{"commit concurrency", gendurable.Config{CommitConcurrency: 1 << 40}, "CommitConcurrency 1099511627776 above 100"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			_, err := gendurable.New(pool, &cfg)
			require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := gendurable.New(nil, nil)
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
	_, err = gendurable.New(pool, nil)
	require.NoError(t, err, "a nil config is an insert-only engine with defaults")
	_, err = gendurable.New(pool, &gendurable.Config{ReaperInterval: time.Millisecond, Retention: time.Second,
		Queues: map[string]gendurable.QueueConfig{"q": {BusyPollInterval: time.Millisecond}}})
	require.NoError(t, err, "the floors themselves are accepted")
	_, err = gendurable.New(pool, &gendurable.Config{LeaseDuration: gendurable.MaxLeaseDuration, MaxStateBytes: 1<<28 - 1, CommitConcurrency: 100})
	require.NoError(t, err, "the ceilings themselves are accepted")
	_, err = gendurable.New(pool, &gendurable.Config{LeaseDuration: gendurable.MinLeaseDuration})
	require.NoError(t, err, "a heartbeat derived from a short lease (LeaseDuration/3) is not a forgotten unit")
	// A lease of a few milliseconds expired within every pick's round
	// trip: the engine ran nothing, and said so only in warnings.
	_, err = gendurable.New(pool, &gendurable.Config{LeaseDuration: 5 * time.Millisecond})
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
	require.ErrorContains(t, err, "LeaseDuration 5ms below 100ms")
	var nilMachine *gendurable.Machine[orderArgs]
	require.ErrorIs(t, nilMachine.ValidateOutcome("a", gendurable.Done(nil)), gendurable.ErrInvalidConfig)
}

// TestStartRefusesUnmigratedSchema: Start on a schema never migrated is
// ErrSchemaVersion (version 0) and ErrNotMigrated, naming what to run.
func TestStartRefusesUnmigratedSchema(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{NoMigrate: true})
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema})
	require.NoError(t, err)
	err = eng.Start(context.Background())
	require.ErrorIs(t, err, gendurable.ErrSchemaVersion)
	require.ErrorIs(t, err, gendurable.ErrNotMigrated, "never migrated: as an insert on it says")
	// The words an insert on it uses (a newcomer met two messages).
	// One "gendurable: " (a newcomer's probe read the doubled prefix).
	// The same prefix as an insert's (a newcomer's probe read two).
	// No inner call name ("start: "; a newcomer's probe).
	require.EqualError(t, err, fmt.Sprintf("%v: schema %q has no gendurable tables; run `gendurable migrate up --schema %s` (or migrate.Up) first",
		gendurable.ErrNotMigrated, schema, schema))
}

// TestStartRefusesASchemaWhoseTablesAreInherited: PostgreSQL's statements
// on a parent table take in the rows of the tables that inherit from it, so
// an engine on a schema where an application's archive was declared
// INHERITS gendurable_instances would pick, retry and list the archive's
// rows (a probe: a bulk retry revived an archived failed row). Start
// refuses it, naming the table and what to do; detached, it starts.
func TestStartRefusesASchemaWhoseTablesAreInherited(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, nil)
	ctx := context.Background()
	archive := `"` + schema + `_archive"`
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+archive+`;
		CREATE TABLE `+archive+`.old_instances (archived_by text) INHERITS ("`+schema+`".gendurable_instances)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA `+archive+` CASCADE`) })
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema})
	require.NoError(t, err)
	err = eng.Start(ctx)
	require.ErrorIs(t, err, migrate.ErrDependents)
	require.ErrorContains(t, err, "old_instances inherits from")
	require.ErrorContains(t, err, "NO INHERIT")
	_, err = migrate.Installed(ctx, pool, schema)
	require.ErrorIs(t, err, migrate.ErrDependents, "migrate reads the version the same way")

	_, err = pool.Exec(ctx, `ALTER TABLE `+archive+`.old_instances NO INHERIT "`+schema+`".gendurable_instances`)
	require.NoError(t, err)
	require.NoError(t, eng.Start(ctx))
	require.NoError(t, eng.Stop(ctx))
}

// TestStartRefusesAPoolThatIsNotReadCommitted: the pick refuses any
// isolation level but read committed, so on a pool whose transactions
// default to another (default_transaction_isolation, set in the URL, for
// the role or the database) an engine with queues started, logged "pick
// failed" every poll and never ran a step. Start refuses it instead, saying
// what to change; an engine without queues picks nothing and starts.
func TestStartRefusesAPoolThatIsNotReadCommitted(t *testing.T) {
	t.Parallel()
	url := dbtest.URL()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{URL: url + sep + "default_transaction_isolation=repeatable%20read", MaxConns: 2})
	job := &gendurable.Job[orderArgs]{Name: "j", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	eng, err := gendurable.New(pool, fastConfig(schema, job))
	require.NoError(t, err)
	err = eng.Start(context.Background())
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
	require.ErrorContains(t, err, "repeatable read")
	require.ErrorContains(t, err, "read committed")

	insertOnly, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{job}})
	require.NoError(t, err)
	require.NoError(t, insertOnly.Start(context.Background()))
	require.NoError(t, insertOnly.Stop(context.Background()))
}

// The same isolation set for the database (as for a role: a setting applied
// at login, nothing in the URL) is refused alike.
func TestStartRefusesADatabaseThatIsNotReadCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbtest.URL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	name := fmt.Sprintf("gdtest_iso_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), dbtest.URL())
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(context.Background())
		}
	})
	_, err = admin.Exec(ctx, "ALTER DATABASE "+name+" SET default_transaction_isolation = 'serializable'")
	require.NoError(t, err)
	u, err := neturl.Parse(dbtest.URL())
	require.NoError(t, err)
	u.Path = "/" + name
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{URL: u.String(), MaxConns: 2})
	job := &gendurable.Job[orderArgs]{Name: "j", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	eng, err := gendurable.New(pool, fastConfig(schema, job))
	require.NoError(t, err)
	err = eng.Start(ctx)
	require.ErrorIs(t, err, gendurable.ErrInvalidConfig)
	require.ErrorContains(t, err, "serializable")
}

// README "Pool size": Start warns when the queues' total Concurrency is at
// least the pool's MaxConns, naming both, and not below that.
func TestStartWarnsWhenConcurrencyReachesThePoolSize(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 4})
	job := &gendurable.Job[orderArgs]{Name: "j", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	const warning = "total queue concurrency reaches the pool size"
	for _, c := range []struct {
		queues map[string]gendurable.QueueConfig
		warns  bool
	}{
		{map[string]gendurable.QueueConfig{"a": {Concurrency: 3}}, false},
		{map[string]gendurable.QueueConfig{"a": {Concurrency: 4}}, true},
		{map[string]gendurable.QueueConfig{"a": {Concurrency: 2}, "b": {Concurrency: 2}}, true}, // the total counts
		{map[string]gendurable.QueueConfig{"a": {}}, true},                                      // the default 10
	} {
		logs := &syncbuf.Buffer{}
		eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{job}, Queues: c.queues,
			Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		require.NoError(t, err)
		require.NoError(t, eng.Start(context.Background()))
		require.NoError(t, eng.Stop(context.Background()))
		out := logs.String()
		if !c.warns {
			require.NotContains(t, out, warning, "queues %v", c.queues)
			continue
		}
		require.Contains(t, out, warning, "queues %v", c.queues)
		require.Contains(t, out, "pool_max_conns=4", "queues %v", c.queues)
		total := 0
		for _, qc := range c.queues {
			total += max(qc.Concurrency, 0)
		}
		if total == 0 {
			total = 10
		}
		require.Contains(t, out, fmt.Sprintf("concurrency=%d", total), "queues %v", c.queues)
	}
}

// TestAMachineOfAQueueTheEngineDoesNotWorkIsNamed: a job whose Queue is not
// among the engine's queues waits for an engine that works it; Start says
// which definitions those are, and WaitReason names the queue and that this
// engine does not work it. Before, a newcomer's Job{Queue: "emails"} beside
// Queues{"default"} waited for good with "runnable, waiting for a worker"
// and no log line.
func TestAMachineOfAQueueTheEngineDoesNotWorkIsNamed(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 4})
	perform := func(context.Context, *gendurable.Run[orderArgs]) error { return nil }
	mail := &gendurable.Job[orderArgs]{Name: "send_mail", Queue: "emails", Perform: perform}
	work := &gendurable.Job[orderArgs]{Name: "work", Perform: perform}
	logs := &syncbuf.Buffer{}
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{mail, work},
		Queues: map[string]gendurable.QueueConfig{"default": {}}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	require.NoError(t, eng.Start(context.Background()))
	t.Cleanup(func() { _ = eng.Stop(context.Background()) })
	require.Contains(t, logs.String(), `machines="[send_mail (queue \"emails\")]"`)
	res, err := eng.Insert(context.Background(), mail.New(orderArgs{}))
	require.NoError(t, err)
	w, err := eng.WaitReason(context.Background(), res.ID)
	require.NoError(t, err)
	require.Equal(t, "emails", w.Queue)
	require.Equal(t, `runnable, waiting for a worker of queue "emails" (not a queue this engine works)`, w.Summary)
	require.Equal(t, w.Summary, fmt.Sprint(w), "a WaitReason prints as its summary")
}

// TestAStartThatCannotReachTheDatabaseCanBeCalledAgain: Start fails while
// the database cannot be reached (here: cut off, so the check waits for
// ctx), leaves the engine stopped, and a later Start, once the database is
// back, starts it (Start's doc: it does not retry, call it again).
func TestAStartThatCannotReachTheDatabaseCanBeCalledAgain(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("startagain")
	b := setup(t, nil, job)
	pool, proxy := timedCutOffPool(t, 4)
	t.Cleanup(pool.Close)
	eng, err := gendurable.New(pool, fastConfig(b.schema, job))
	require.NoError(t, err)

	proxy.Cut()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err = eng.Start(ctx)
	cancel()
	require.Error(t, err)
	proxy.Heal()
	require.NoError(t, eng.Start(context.Background()), "left stopped, so it starts")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Stop(ctx)
	})
	id := b.insert(job.New(orderArgs{I: 1}))
	b.waitStatus(id, "done", 10*time.Second)
}

func TestStartStopRepeatedly(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("cycle")
	b := setup(t, nil, job)
	ctx := context.Background()
	//lint:ignore SA1012 a nil context is the misuse under test
	require.ErrorIs(t, b.eng.Start(nil), gendurable.ErrInvalidInput)
	for i := 0; i < 10; i++ {
		require.NoError(t, b.eng.Start(ctx))
		require.ErrorIs(t, b.eng.Start(ctx), gendurable.ErrAlreadyStarted)
		//lint:ignore SA1012 a nil context is the misuse under test
		require.ErrorIs(t, b.eng.Stop(nil), gendurable.ErrInvalidInput, "refused, the engine left running")
		id := b.insert(job.New(orderArgs{I: i}))
		b.waitStatus(id, "done", 10*time.Second)
		require.NoError(t, b.eng.Stop(ctx))
		require.NoError(t, b.eng.Stop(ctx), "Stop is idempotent")
	}
	require.Len(t, rec.order(), 10)
}

// TestANilContextIsATypedError: every method that takes a context refuses a
// nil one with ErrInvalidInput, as Start and Stop do; an API probe saw
// eight of them panic on a nil dereference and two inside
// context.WithTimeout.
func TestANilContextIsATypedError(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("nilctx")
	b := setup(t, nil, job)
	e := b.eng
	var nilCtx context.Context
	calls := map[string]func() error{
		"List":           func() error { _, err := e.List(nilCtx, gendurable.ListFilter{}); return err },
		"Describe":       func() error { _, err := e.Describe(nilCtx, 1); return err },
		"DescribeWith":   func() error { _, err := e.DescribeWith(nilCtx, 1, gendurable.DescribeOptions{}); return err },
		"Cancel":         func() error { return e.Cancel(nilCtx, 1, "") },
		"Queues":         func() error { _, err := e.Queues(nilCtx); return err },
		"Pause":          func() error { return e.Pause(nilCtx, "default") },
		"Resume":         func() error { return e.Resume(nilCtx, "default") },
		"SetPaused":      func() error { return e.SetPaused(nilCtx, "default", true, nil) },
		"RemoveQueue":    func() error { return e.RemoveQueue(nilCtx, "default") },
		"Prune":          func() error { _, err := e.Prune(nilCtx, time.Hour, nil); return err },
		"RetryMany":      func() error { _, err := e.RetryMany(nilCtx, []int64{1}); return err },
		"CancelMany":     func() error { _, err := e.CancelMany(nilCtx, []int64{1}, ""); return err },
		"RetryMatching":  func() error { _, err := e.RetryMatching(nilCtx, gendurable.ListFilter{All: true}); return err },
		"CancelMatching": func() error { _, err := e.CancelMatching(nilCtx, gendurable.ListFilter{All: true}, ""); return err },
		"CancelTree":     func() error { _, err := e.CancelTree(nilCtx, 1, ""); return err },
		"Reap":           func() error { _, err := e.Reap(nilCtx); return err },
		"ListMachines":   func() error { _, err := e.ListMachines(nilCtx); return err },
		"Graph":          func() error { _, err := e.Graph(nilCtx, "nilctx"); return err },
		"Insert":         func() error { _, err := e.Insert(nilCtx, job.New(orderArgs{})); return err },
		"InsertMany": func() error {
			_, err := e.InsertMany(nilCtx, []gendurable.InsertParams{job.New(orderArgs{})})
			return err
		},
		"InsertTx": func() error { _, err := e.InsertTx(nilCtx, nil, job.New(orderArgs{})); return err },
		"InsertManyTx": func() error {
			_, err := e.InsertManyTx(nilCtx, nil, []gendurable.InsertParams{job.New(orderArgs{})})
			return err
		},
		"Instance":   func() error { _, err := e.Instance(nilCtx, 1); return err },
		"Retry":      func() error { return e.Retry(nilCtx, 1) },
		"RunNow":     func() error { return e.RunNow(nilCtx, 1) },
		"Signal":     func() error { _, err := e.Signal(nilCtx, 1, "go", nil, nil); return err },
		"SignalTx":   func() error { _, err := e.SignalTx(nilCtx, nil, 1, "go", nil, nil); return err },
		"Wait":       func() error { _, err := e.Wait(nilCtx, 1); return err },
		"WaitReason": func() error { _, err := e.WaitReason(nilCtx, 1); return err },
		"Throughput": func() error { _, err := e.Throughput(nilCtx); return err },
		"WaitResult": func() error { _, err := gendurable.WaitResult[any](nilCtx, e, 1); return err },
	}
	for name, call := range calls {
		var err error
		require.NotPanics(t, func() { err = call() }, name)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, name)
		require.ErrorContains(t, err, name+": nil context")
	}
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances`), "nothing inserted")
}

func TestPriorityOrder(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("prio")
	cfg := &gendurable.Config{
		Machines: []gendurable.Definition{job},
		// One slot, one pick at a time: the run order is the pick order.
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: -1, PollInterval: 10 * time.Millisecond}},
	}
	b := setup(t, cfg)
	ctx := context.Background()
	_, err := b.eng.InsertMany(ctx, []gendurable.InsertParams{
		job.New(orderArgs{I: 3}).With(gendurable.InsertOpts{Priority: 3}),
		job.New(orderArgs{I: 1}).With(gendurable.InsertOpts{Priority: -5}),
		job.New(orderArgs{I: 2}).With(gendurable.InsertOpts{Priority: 0}),
		job.New(orderArgs{I: 4}).With(gendurable.InsertOpts{Priority: 3}),
	})
	require.NoError(t, err)
	b.start()
	eventually(t, 10*time.Second, func() bool { return len(rec.order()) == 4 }, "jobs did not run")
	require.Equal(t, []int{1, 2, 3, 4}, rec.order(), "lower priority first; ties by eligibility")
}

func TestQueueRouting(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("routed")
	cfg := &gendurable.Config{
		Machines: []gendurable.Definition{job},
		Queues:   map[string]gendurable.QueueConfig{"mine": {PollInterval: 10 * time.Millisecond}},
	}
	b := setup(t, cfg)
	b.start()
	other := b.insert(job.New(orderArgs{I: 1})) // machine default queue "default": not worked here
	mine := b.insert(job.New(orderArgs{I: 2}).With(gendurable.InsertOpts{Queue: "mine"}))
	ctx := t.Context()
	gendurabletest.WorkUntilFinished(ctx, t, b.eng, mine)
	require.Equal(t, mine, gendurabletest.RequireInserted(ctx, t, b.eng, job, &gendurabletest.InsertedOpts[orderArgs]{
		Queue: "mine", Status: gendurable.StatusDone,
	}).ID)
	time.Sleep(100 * time.Millisecond)
	// A queue this engine does not work is never picked.
	require.Equal(t, other, gendurabletest.RequireInserted(ctx, t, b.eng, job, &gendurabletest.InsertedOpts[orderArgs]{
		Queue: "default", Status: gendurable.StatusRunnable,
	}).ID)
	require.Equal(t, []int{2}, rec.order())
}

// pickCounter counts pick statements through the hook.
type pickCounter struct{ n atomic.Int32 }

func (p *pickCounter) OnEvent(_ context.Context, ev gendurable.Event) {
	if _, ok := ev.(*gendurable.PickEvent); ok {
		p.n.Add(1)
	}
}

func TestIdleQueueBacksOff(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	job := rec.job("idle")
	picks := &pickCounter{}
	cfg := &gendurable.Config{
		Machines: []gendurable.Definition{job},
		Hooks:    []gendurable.Hook{picks},
		Queues:   map[string]gendurable.QueueConfig{"default": {PollInterval: 10 * time.Millisecond, MaxPollInterval: 160 * time.Millisecond}},
	}
	b := setup(t, cfg)
	b.start()
	time.Sleep(1500 * time.Millisecond)
	// Without backoff: ~150 picks. With it: 10+20+40+80+160 ms, then every 160 ms.
	n := picks.n.Load()
	require.LessOrEqual(t, n, int32(20), "an idle queue backs off (%d picks in 1.5s)", n)
	require.GreaterOrEqual(t, n, int32(5), "but keeps polling")

	// Work snaps the interval back: a row inserted by another process (no
	// local wake-up) is found within the backoff ceiling.
	other, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{job}})
	require.NoError(t, err)
	res, err := other.Insert(context.Background(), job.New(orderArgs{I: 1}))
	require.NoError(t, err)
	b.waitStatus(res.ID, "done", 2*time.Second)
}

// TestBusyQueuePicksUpOtherProcessesInserts: rows inserted where this engine
// cannot see them (another engine, so no local wake-up) are picked up within
// tens of milliseconds while the queue is busy, though PollInterval is 2s —
// both when no step finishes meanwhile and when steps finish all the time
// (each finish wakes the feeder; that must not restart its poll timer).
func TestBusyQueuePicksUpOtherProcessesInserts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		work     time.Duration
		gap      time.Duration // between the other process's inserts
		inserts  int
		expected time.Duration // the 75th percentile of pickups must stay below
	}{
		{"no step finishes", 2500 * time.Millisecond, 20 * time.Millisecond, 60, 100 * time.Millisecond},
		{"steps finish all the time", 100 * time.Millisecond, 20 * time.Millisecond, 60, 100 * time.Millisecond},
		// Each insert is worked at once, so the queue drains between
		// inserts: the feeder's picks of the empty queue must not back its
		// poll interval off while work keeps arriving (backing off, every
		// other pickup waited ~150 ms here: 25, 50, 100 ms of empty polls).
		{"the queue drains between inserts", 0, 200 * time.Millisecond, 25, 75 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			started := map[int64]time.Time{}
			job := &gendurable.Job[orderArgs]{Name: "busy", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
				mu.Lock()
				started[j.ID] = time.Now()
				mu.Unlock()
				time.Sleep(c.work)
				return nil
			}}
			cfg := &gendurable.Config{
				Machines: []gendurable.Definition{job},
				Queues:   map[string]gendurable.QueueConfig{"default": {Concurrency: 100, PollInterval: 2 * time.Second, MaxPollInterval: 2 * time.Second}},
			}
			b := setup(t, cfg)
			b.start()
			other, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{job}})
			require.NoError(t, err)
			time.Sleep(100 * time.Millisecond)  // the first, empty pick: the queue is idle, polling every 2s
			b.insert(job.New(orderArgs{I: -1})) // a local insert wakes it: the queue is busy from here on
			var ids []int64
			for i := range c.inserts {
				res, err := other.Insert(context.Background(), job.New(orderArgs{I: i}))
				require.NoError(t, err)
				ids = append(ids, res.ID)
				time.Sleep(c.gap)
			}
			for _, id := range ids {
				b.waitStatus(id, "done", 10*time.Second)
			}
			// Pickup: the step's start against the row's insert time (one
			// machine, one clock).
			var pickups []time.Duration
			for _, id := range ids {
				var inserted time.Time
				require.NoError(t, b.pool.QueryRow(context.Background(),
					replaceSchema(`SELECT inserted_at FROM {{s}}.gendurable_instances WHERE id = $1`, b.schema), id).Scan(&inserted))
				mu.Lock()
				pickups = append(pickups, started[id].Sub(inserted))
				mu.Unlock()
			}
			slices.Sort(pickups)
			median, p75 := pickups[len(pickups)/2], pickups[len(pickups)*3/4]
			t.Logf("pickup of other processes' inserts on a busy queue: median %s, p75 %s, max %s", median, p75, pickups[len(pickups)-1])
			// At PollInterval alone the median is about half of 2s with no
			// finishing step, and 100+ ms when finishing steps restart the
			// poll timer; at BusyPollInterval (25 ms) it is ~20 ms.
			require.Less(t, p75, c.expected, "busy queue polls at BusyPollInterval")
		})
	}
}

type counterState struct {
	N int `json:"n"`
}

// fsm3 is a three-step machine: a → b → c → done.
func fsm3() *gendurable.Machine[counterState] {
	next := func(step string) gendurable.StepFunc[counterState] {
		return func(ctx context.Context, r *gendurable.Run[counterState]) (gendurable.Outcome, error) {
			return r.Next(step, counterState{N: r.State.N + 1}), nil
		}
	}
	return &gendurable.Machine[counterState]{
		Name: "fsm3", Start: "a",
		Steps: map[string]gendurable.StepFunc[counterState]{
			"a": next("b"),
			"b": next("c"),
			"c": func(ctx context.Context, r *gendurable.Run[counterState]) (gendurable.Outcome, error) {
				return gendurable.Done(counterState{N: r.State.N + 1}), nil
			},
		},
	}
}

// TestStatementsPerStep counts the database statements the engine issues per
// step (pgx tracer) while working a backlog of three-step machines at
// concurrency 50: outcomes of concurrent steps share a statement (group
// commit), a Next continues without a pick, and a pick claims a batch.
func TestStatementsPerStep(t *testing.T) {
	t.Parallel()
	counter := &dbtest.Counter{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{Tracer: counter, MaxConns: 20})
	m := fsm3()
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema: schema, Machines: []gendurable.Definition{m}, Logger: testLogger(t),
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 50, PollInterval: 50 * time.Millisecond}},
	})
	require.NoError(t, err)
	ctx := context.Background()
	const instances = 1000
	ps := make([]gendurable.InsertParams, instances)
	for i := range ps {
		ps[i] = m.New(counterState{})
	}
	counter.Reset()
	_, err = eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	require.Equal(t, int64(1), counter.Count(), "insert-many is one statement")

	var doneCount int
	counter.Reset()
	require.NoError(t, eng.Start(ctx))
	start := time.Now()
	for {
		require.NoError(t, pool.QueryRow(ctx, "-- untraced\nSELECT count(*) FROM "+schema+
			".gendurable_instances WHERE status = 'done'").Scan(&doneCount))
		if doneCount == instances {
			break
		}
		require.Less(t, time.Since(start), 60*time.Second, "instances did not finish")
		time.Sleep(20 * time.Millisecond)
	}
	statements := counter.Count() - 2 // the schema version check and the reaper's first sweep, at Start
	require.NoError(t, eng.Stop(ctx))
	steps := 3 * instances
	perStep := float64(statements) / float64(steps)
	t.Logf("%d statements for %d steps: %.2f statements per step", statements, steps, perStep)
	// Group commit shares one outcome statement among concurrent steps, and a
	// Next continues in the same worker without a pick.
	require.LessOrEqual(t, perStep, 0.5, "round trips per step at concurrency 50")
}

// claimCounter sums the rows claimed by picks.
type claimCounter struct{ n atomic.Int64 }

func (c *claimCounter) OnEvent(_ context.Context, ev gendurable.Event) {
	if p, ok := ev.(*gendurable.PickEvent); ok {
		c.n.Add(int64(p.Count))
	}
}

// TestNextChainsWithoutRepickingUpToChainSteps: a five-step machine with
// ChainSteps 2 runs three steps per claim, so it is claimed twice.
func TestNextChainsWithoutRepickingUpToChainSteps(t *testing.T) {
	t.Parallel()
	step := func(next string) gendurable.StepFunc[counterState] {
		return func(ctx context.Context, r *gendurable.Run[counterState]) (gendurable.Outcome, error) {
			if next == "" {
				return gendurable.Done(r.State), nil
			}
			return r.Next(next, counterState{N: r.State.N + 1}), nil
		}
	}
	m := &gendurable.Machine[counterState]{Name: "five", Start: "s1", Steps: map[string]gendurable.StepFunc[counterState]{
		"s1": step("s2"), "s2": step("s3"), "s3": step("s4"), "s4": step("s5"), "s5": step(""),
	}}
	claims := &claimCounter{}
	cfg := fastConfig("", m)
	cfg.Hooks = []gendurable.Hook{claims}
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {ChainSteps: 2, PollInterval: 10 * time.Millisecond}}
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(counterState{}))
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `{"n":4}`, string(r.Result))
	require.Equal(t, int64(2), claims.n.Load(), "claimed twice: steps 1-3, then 4-5")
}

// sqlRecorder is a pgx tracer that keeps the text of every statement.
type sqlRecorder struct {
	mu  sync.Mutex
	sql []string
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	r.sql = append(r.sql, strings.TrimSpace(d.SQL))
	r.mu.Unlock()
	return ctx
}

func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestClaimBringsInboxAndChildren: a step after an await, a step of a
// machine that reads its inbox (chained after a Next that consumed a
// signal), and a step after a fan-out get their signals and children from
// the statement that claimed them: the engine runs no statement but picks,
// outcomes, heartbeats, signals and inserts (docs/design.md §4) — and the
// input read again as a step begins (sqlq.ClaimInput): the inbox of a
// claim that waited 5 ms or more in the buffer, which a loaded machine
// meets (a full-suite run failed here on it), and the children of every
// join a pick claimed.
func TestClaimBringsInboxAndChildren(t *testing.T) {
	t.Parallel()
	parent, leaf := fanMachines()
	type st struct {
		Seen []string `json:"seen"`
	}
	names := func(sigs []gendurable.Signal) []string {
		out := []string{}
		for _, s := range sigs {
			out = append(out, s.Name+"="+string(s.Payload))
		}
		return out
	}
	waiter := &gendurable.Machine[st]{
		Name: "waiter", Start: "a", Inbox: true,
		Steps: map[string]gendurable.StepFunc[st]{
			"a": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				return r.Await("b", r.State, "go"), nil
			},
			"b": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				s := st{Seen: append(names(r.Awaited), "|")}
				s.Seen = append(s.Seen, names(r.Inbox)...)
				return r.Next("c", s), nil // consumes the awaited "go"; chained to c
			},
			"c": func(ctx context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				return gendurable.Done(st{Seen: append(append(r.State.Seen, "|"), names(r.Inbox)...)}), nil
			},
		},
	}
	rec := &sqlRecorder{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{Tracer: rec})
	cfg := fastConfig(schema, parent, leaf, waiter)
	cfg.Logger = testLogger(t)
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	b := &testBundle{t: t, pool: pool, schema: schema, eng: eng}
	rec.mu.Lock()
	rec.sql = nil // the schema's migration
	rec.mu.Unlock()
	b.start()
	ctx := context.Background()

	w := b.insert(waiter.New(st{}))
	b.waitStatus(w, "awaiting_signal", 5*time.Second)
	_, err = eng.Signal(ctx, w, "note", map[string]int{"n": 1}, nil)
	require.NoError(t, err)
	_, err = eng.Signal(ctx, w, "go", map[string]int{"n": 2}, nil)
	require.NoError(t, err)
	r := b.waitStatus(w, "done", 10*time.Second)
	require.JSONEq(t, `{"seen":["go={\"n\": 2}","|","note={\"n\": 1}","go={\"n\": 2}","|","note={\"n\": 1}"]}`, string(r.Result),
		"b saw go awaited and both in its inbox; c, chained after consuming go, saw only note")

	p := b.insert(parent.New(fanState{Width: 3}))
	r = b.waitStatus(p, "done", 10*time.Second)
	require.JSONEq(t, `{"width":3,"depth":0,"seen":["leaf:done","leaf:done","leaf:done"],"resumes":1,"child_sum":3}`, string(r.Result))

	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, sql := range rec.sql {
		known := false
		for _, prefix := range []string{"WITH locked AS", "WITH o AS", "WITH h AS", "WITH target AS", "INSERT INTO",
			"WITH expired AS", "WITH due AS", "SELECT obj_description", "SELECT current_setting", "SELECT set_config", "begin", "commit",
			"SELECT id, fsm, fsm_version", "SELECT p.next_cursor", "SELECT CASE WHEN $3::bool THEN",
			// The pick's floor check (at most once a FloorCheck, 1 s, while
			// the queue claims rows): a run slower than a second has one (CI).
			"SELECT min(x.eligible_at)"} {
			known = known || strings.HasPrefix(sql, prefix)
		}
		require.True(t, known, "a statement beyond the hot path: %.80q", sql)
	}
}

func TestUnknownVersionIsReleasedNotRun(t *testing.T) {
	t.Parallel()
	var ranV1, ranV2 atomic.Int32
	mk := func(v int, ran *atomic.Int32) *gendurable.Job[orderArgs] {
		return &gendurable.Job[orderArgs]{Name: "versioned", Version: v, Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			require.Equal(t, v, j.Version)
			ran.Add(1)
			return nil
		}}
	}
	v1, v2 := mk(1, &ranV1), mk(2, &ranV2)
	log := &eventLog{}
	// This worker only knows version 2.
	cfg := fastConfig("", v2)
	cfg.Hooks = []gendurable.Hook{log}
	cfg.UnknownVersionDelay = time.Hour
	b := setup(t, cfg)
	// An older producer inserts a version-1 row.
	producer, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{v1}})
	require.NoError(t, err)
	old, err := producer.Insert(context.Background(), v1.New(orderArgs{}))
	require.NoError(t, err)
	b.start()
	cur := b.insert(v2.New(orderArgs{}))
	b.waitStatus(cur, "done", 10*time.Second)
	eventually(t, 5*time.Second, func() bool {
		_, ok := findEvent(log, func(e *gendurable.UnknownVersionEvent) bool { return e.InstanceID == old.ID && e.Version == 1 })
		return ok
	}, "no unknown-version event")
	r := b.row(old.ID)
	require.Equal(t, "runnable", r.Status, "released, never failed")
	require.Equal(t, 0, r.Attempt)
	require.Len(t, r.Errors, 1, "its release is in the history, counting no attempt")
	require.Equal(t, "unknown_version", r.Errors[0]["kind"])
	near(t, r.Now.Add(time.Hour), r.EligibleAt, time.Minute)
	require.Zero(t, ranV1.Load())

	// A process that knows both runs each row on its own version. (The
	// v2-only engine stops first: it would release the row again.)
	require.NoError(t, b.eng.Stop(context.Background()))
	b.exec(`UPDATE {{s}}.gendurable_instances SET eligible_at = now() WHERE id = $1`, old.ID)
	both, err := gendurable.New(b.pool, fastConfig(b.schema, v1, v2))
	require.NoError(t, err)
	require.NoError(t, both.Start(context.Background()))
	defer func() { _ = both.Stop(context.Background()) }()
	b.waitStatus(old.ID, "done", 10*time.Second)
	require.Equal(t, int32(1), ranV1.Load())
	require.Equal(t, int32(1), ranV2.Load())
}

// TestUnknownMachineRowSaysSo: a row of a (machine, version) that no
// running process registers — a deploy removed the machine — is released
// every UnknownVersionDelay, for as long as that lasts. Before, nothing on
// the row said why: Describe showed no error and WaitReason "sleeping until
// …", as for a durable sleep. Now each release leaves an entry of kind
// unknown_version in the history (the previous such entry gives it its
// place, so repeats do not push real errors out), WaitReason says so while
// the row waits, and a deploy that knows the machine runs it as before.
// TestUnknownMachineReleasesAreLoggedOncePerInterval: a process meeting
// many rows of a machine it does not know logs one warning for them (then
// one a minute, counting those left unlogged), while every row's history
// still says so. Before: one line per row per release (a probe: 4,000
// lines in 65 s for 2,000 rows).
func TestUnknownMachineReleasesAreLoggedOncePerInterval(t *testing.T) {
	t.Parallel()
	m := probeMachine(nil)
	logs := &syncbuf.Buffer{}
	cfg := fastConfig("", m)
	cfg.UnknownVersionDelay = 200 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b := setup(t, cfg)
	const rows = 20
	for range rows {
		b.insert(m.New(probeState{Do: "done"}))
	}
	b.exec(`UPDATE {{s}}.gendurable_instances SET fsm = 'gone'`)
	b.start()
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE errors @> '[{"kind": "unknown_version"}]'`) == rows
	}, "every row's history says it was released")
	time.Sleep(time.Second) // several more releases of each (every 200 ms)
	require.Equal(t, 1, strings.Count(logs.String(), "machine version this process does not know"), logs.String())
}

func TestUnknownMachineRowSaysSo(t *testing.T) {
	t.Parallel()
	m := probeMachine(nil)
	cfg := fastConfig("", m)
	cfg.UnknownVersionDelay = 200 * time.Millisecond
	b := setup(t, cfg)
	id := b.insert(m.New(probeState{Do: "error"}))
	b.exec(`UPDATE {{s}}.gendurable_instances SET fsm = 'gone' WHERE id = $1`, id)
	// A real error before the deploy stays in the history.
	b.exec(`UPDATE {{s}}.gendurable_instances SET errors = '[{"step": "a", "attempt": 0, "kind": "error", "error": "boom", "at": "2026-01-01T00:00:00Z"}]' WHERE id = $1`, id)
	b.start()
	var claims int
	eventually(t, 10*time.Second, func() bool {
		claims = b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND claim_token IS NULL AND status = 'runnable' AND updated_at > inserted_at + interval '700 milliseconds'`, id)
		return claims == 1
	}, "released several times")
	r := b.row(id)
	require.Equal(t, 0, r.Attempt)
	require.Len(t, r.Errors, 2, "one entry for every release, and the real error kept")
	require.Equal(t, "boom", r.Errors[0]["error"])
	require.Equal(t, "unknown_version", r.Errors[1]["kind"])
	require.Contains(t, r.Errors[1]["error"], `machine "gone" version 1 is not registered in the process that claimed it`)
	w, err := b.eng.WaitReason(context.Background(), id)
	require.NoError(t, err)
	require.Contains(t, w.Summary, "released unrun until")
	require.Contains(t, w.Summary, `machine "gone" version 1 is not registered`)
	require.NotContains(t, w.Summary, "sleeping")
	d, err := b.eng.Describe(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, "unknown_version", d.Errors[len(d.Errors)-1].Kind)

	// A durable sleep after the row ran again is a sleep, whatever the history says.
	require.NoError(t, b.eng.Stop(context.Background()))
	b.exec(`UPDATE {{s}}.gendurable_instances SET fsm = 'probe', eligible_at = now() + interval '1 hour' WHERE id = $1`, id)
	w, err = b.eng.WaitReason(context.Background(), id)
	require.NoError(t, err)
	require.Regexp(t, `^sleeping until \S+ \(in (59m59s|1h0m0s)\)$`, w.Summary)
	require.True(t, w.Delayed, "a sleep is Delayed")
	// A RunAt past what a Duration holds (about 292 years) is no saturated figure.
	b.exec(`UPDATE {{s}}.gendurable_instances SET eligible_at = '294275-12-31 00:00:00+00' WHERE id = $1`, id)
	w, err = b.eng.WaitReason(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, "sleeping until 294275-12-31T00:00:00Z (in over 100 years)", w.Summary)
	// A retry's backoff is not a sleep.
	b.exec(`UPDATE {{s}}.gendurable_instances SET eligible_at = now() + interval '1 hour', attempt = 2 WHERE id = $1`, id)
	w, err = b.eng.WaitReason(context.Background(), id)
	require.NoError(t, err)
	require.Regexp(t, `^backing off until \S+ \(in (59m59s|1h0m0s)\) before attempt 3$`, w.Summary)
	require.True(t, w.Delayed, "a backoff is Delayed")
	// Eligible now: not Delayed.
	b.exec(`UPDATE {{s}}.gendurable_instances SET eligible_at = now() - interval '1 second' WHERE id = $1`, id)
	w, err = b.eng.WaitReason(context.Background(), id)
	require.NoError(t, err)
	require.False(t, w.Delayed, "an eligible row is not Delayed: %s", w.Summary)
}

func TestOutcomeTheDatabaseRejectsStopsTheInstance(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[weirdState]{
		Name: "nul", Start: "a",
		Steps: map[string]gendurable.StepFunc[weirdState]{
			"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
				return r.Next("a", weirdState{Name: "has\x00nul"}), nil // jsonb cannot store \u0000
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(weirdState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, "outcome_rejected", r.Errors[0]["kind"])
	require.Contains(t, r.Errors[0]["error"], "outcome rejected by the database")
}

// TestOutcomeOverTheDatabaseLimitStopsOnlyItself: with the depth check off,
// an outcome PostgreSQL cannot parse ("stack depth limit exceeded") must
// stop its own instance at once — not be retried until the lease runs out,
// taking the outcomes group-committed with it along.
func TestOutcomeOverTheDatabaseLimitStopsOnlyItself(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	runs := map[int64]int{}
	bystander := &gendurable.Job[deepState]{Name: "bystander", Perform: func(ctx context.Context, r *gendurable.Run[deepState]) error {
		mu.Lock()
		runs[r.ID]++
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		return nil
	}}
	deep := &gendurable.Machine[deepState]{
		Name: "deep_outcome", Start: "a",
		Steps: map[string]gendurable.StepFunc[deepState]{
			"a": func(ctx context.Context, r *gendurable.Run[deepState]) (gendurable.Outcome, error) {
				time.Sleep(5 * time.Millisecond)
				return r.Next("a", deepState{V: fzNested(30000)}), nil
			},
		},
	}
	cfg := fastConfig("", bystander, deep)
	cfg.MaxJSONDepth = -1
	cfg.CommitConcurrency = 1 // outcomes that finish meanwhile share the next statement
	cfg.LeaseDuration, cfg.HeartbeatInterval = time.Minute, 20*time.Second
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 16, PollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	var ps []gendurable.InsertParams
	for i := range 200 {
		ps = append(ps, bystander.New(deepState{}))
		if i%50 == 25 {
			ps = append(ps, deep.New(deepState{}))
		}
	}
	_, err := b.eng.InsertMany(context.Background(), ps)
	require.NoError(t, err)
	b.start()
	eventually(t, 20*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status NOT IN ('done', 'failed')`) == 0
	}, "every instance finished well within one lease")
	require.Equal(t, 200, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'bystander' AND status = 'done'`))
	require.Equal(t, 4, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE fsm = 'deep_outcome' AND status = 'failed'
		AND errors->0->>'kind' = 'outcome_rejected' AND errors->0->>'error' LIKE '%stack depth%'`))
	mu.Lock()
	defer mu.Unlock()
	for id, n := range runs {
		require.Equal(t, 1, n, "bystander %d ran %d times", id, n)
	}
}

// A WithTx outcome the database rejects stops the instance with the reason.
func TestRejectedTransactionalOutcomeStops(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[weirdState]{
		Name: "txnul", Start: "a", MaxAttempts: 2,
		Steps: map[string]gendurable.StepFunc[weirdState]{
			"a": func(ctx context.Context, r *gendurable.Run[weirdState]) (gendurable.Outcome, error) {
				return r.Next("a", weirdState{Name: "nul\x00"}).WithTx(func(context.Context, pgx.Tx) error { return nil }), nil
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	id := b.insert(m.New(weirdState{}))
	r := b.waitStatus(id, "failed", 10*time.Second)
	require.Equal(t, "outcome_rejected", r.Errors[0]["kind"])
}

// TestWithTxWaitingOnALockKeepsItsClaim: a WithTx transaction waits for
// three leases on a row another transaction holds — in its callback (a
// contended row of the application), or in the outcome statement (the
// instance row itself, as an open SignalTx holds it). Its worker is alive and
// its claim is heartbeated (or, while locked, cannot be reaped), so the
// transaction must not be given up after one lease (the step would be
// reaped and run again with attempt + 1): it commits once the lock is
// released, on the first attempt.
func TestWithTxWaitingOnALockKeepsItsClaim(t *testing.T) {
	t.Parallel()
	for _, lockInstance := range []bool{false, true} {
		name := "callback waits on an application row"
		if lockInstance {
			name = "outcome waits on the instance row"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int32
			var schema string
			waiting, proceed := make(chan struct{}, 10), make(chan struct{})
			m := &gendurable.Machine[orderArgs]{
				Name: "contended", Start: "pay",
				Steps: map[string]gendurable.StepFunc[orderArgs]{
					"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
						runs.Add(1)
						return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
							waiting <- struct{}{}
							<-proceed
							_, err := tx.Exec(ctx, "UPDATE "+schema+".contended SET n = n + 1 WHERE id = 1")
							return err
						}), nil
					},
				},
			}
			cfg := fastConfig("", m)
			cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 300*time.Millisecond, 100*time.Millisecond
			b := setup(t, cfg)
			schema = b.schema
			b.exec(`CREATE TABLE {{s}}.contended (id int PRIMARY KEY, n int NOT NULL)`)
			b.exec(`INSERT INTO {{s}}.contended VALUES (1, 0)`)
			b.start()
			id := b.insert(m.New(orderArgs{}))
			select {
			case <-waiting:
			case <-time.After(20 * time.Second):
				t.Fatal("the step never ran")
			}

			ctx := context.Background()
			holder, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(ctx) }()
			lock, args := `UPDATE {{s}}.contended SET n = n + 100 WHERE id = 1`, []any(nil)
			if lockInstance {
				lock, args = `SELECT 1 FROM {{s}}.gendurable_instances WHERE id = $1 FOR UPDATE`, []any{id}
			}
			_, err = holder.Exec(ctx, replaceSchema(lock, b.schema), args...)
			require.NoError(t, err)
			close(proceed)
			time.Sleep(3 * time.Second) // three leases
			require.NoError(t, holder.Rollback(ctx))

			r := b.waitStatus(id, "done", 20*time.Second)
			require.Equal(t, 0, r.Attempt, "the waiting transaction was given up and the step reaped: %v", r.Errors)
			require.Empty(t, r.Errors)
			require.Equal(t, int32(1), runs.Load(), "the step ran again")
			require.Equal(t, 1, b.count(`SELECT n FROM {{s}}.contended WHERE id = 1`))
		})
	}
}

// TestWithTxCutOffFromTheDatabaseLetsGoOfItsLocks: a worker is cut off from
// the database (a network partition: no byte goes through, no socket is
// closed) while its WithTx callback holds a lock on an application row. The
// server cannot tell: the session stays idle in transaction with the lock
// until something on the server ends it — the OS's TCP keepalive, two hours
// by default. The step's rerun by another worker, once the lease is gone,
// needs the same row. The engine sets idle_in_transaction_session_timeout
// (the lease) on its own transactions, so the server ends the orphan and
// the rerun finishes; without it the rerun waits on the lock for hours.
func TestWithTxCutOffFromTheDatabaseLetsGoOfItsLocks(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	var schema string
	inTx := make(chan struct{}, 1)
	m := &gendurable.Machine[orderArgs]{
		Name: "cutoff", Start: "pay",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				n := runs.Add(1)
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "UPDATE "+schema+".account SET n = n + 1 WHERE id = 1"); err != nil {
						return err
					}
					if n == 1 {
						inTx <- struct{}{}
						<-ctx.Done() // the partition comes now; the lease is lost
						return ctx.Err()
					}
					return nil
				}), nil
			},
		},
	}
	short := func(cfg *gendurable.Config) *gendurable.Config {
		cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 300*time.Millisecond, 100*time.Millisecond
		return cfg
	}
	b := setup(t, short(fastConfig("", m)))
	schema = b.schema
	b.exec(`CREATE TABLE {{s}}.account (id int PRIMARY KEY, n int NOT NULL)`)
	b.exec(`INSERT INTO {{s}}.account VALUES (1, 0)`)

	// Worker A reaches the database only through a proxy that can cut it off.
	poolA, proxy := timedCutOffPool(t, 4)
	engA, err := gendurable.New(poolA, short(fastConfig(b.schema, m)))
	require.NoError(t, err)
	require.NoError(t, engA.Start(context.Background()))
	t.Cleanup(func() {
		proxy.Close() // A's sockets end: its stop does not wait on a partition
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = engA.Stop(ctx)
		poolA.Close()
	})

	id := b.insert(m.New(orderArgs{}))
	select {
	case <-inTx:
	case <-time.After(20 * time.Second):
		t.Fatal("worker A never ran the step")
	}
	proxy.Cut()
	b.start() // worker B, connected directly, reruns the step once A's lease is gone

	r := b.waitStatus(id, "done", 20*time.Second)
	require.Equal(t, int32(2), runs.Load(), "A's run, then B's rerun: %v", r.Errors)
	require.Equal(t, 1, b.count(`SELECT n FROM {{s}}.account WHERE id = 1`), "A's write was rolled back with its session, B's committed")
}

// TestWorkerCutOffAndBackResumesWork: a worker is cut off from the database
// (a partition: nothing crosses, nothing is closed) while it runs steps,
// another worker takes its rows over once their leases are gone, and then
// the partition heals: what the cut worker sent meanwhile arrives late. Its
// late writes change nothing that is no longer its own (every step's
// result is the one of a run that held the claim), and it goes back to work
// by itself: rows inserted after the heal, with the other worker stopped,
// are all done by it.
func TestWorkerCutOffAndBackResumesWork(t *testing.T) {
	t.Parallel()
	type run struct {
		worker     string
		start, end time.Time
		cancelled  bool
	}
	var mu sync.Mutex
	runs := map[int64][]run{}
	var runningA atomic.Int32 // A's steps under way now
	job := func(worker string) *gendurable.Job[orderArgs] {
		return &gendurable.Job[orderArgs]{Name: "heal", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			r := run{worker: worker, start: time.Now()}
			if worker == "A" {
				runningA.Add(1)
				defer runningA.Add(-1)
			}
			select {
			case <-ctx.Done():
				r.cancelled = true
			case <-time.After(300 * time.Millisecond):
			}
			r.end = time.Now()
			mu.Lock()
			runs[j.ID] = append(runs[j.ID], r)
			mu.Unlock()
			return ctx.Err()
		}}
	}
	short := func(cfg *gendurable.Config) *gendurable.Config {
		cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 300*time.Millisecond, 100*time.Millisecond
		return cfg
	}
	jobB := job("B")
	b := setup(t, short(fastConfig("", jobB)))

	_, proxy := b.proxiedEngine(short(fastConfig(b.schema, job("A"))))

	var first []int64
	for i := range 12 {
		first = append(first, b.insert(jobB.New(orderArgs{I: i})))
	}
	eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs) > 0
	}, "worker A never finished a step")
	// Cut while a step of A is under way (its steps take 300 ms): between
	// two of them A may hold only buffered claims, and a cut there caught
	// no run in flight.
	eventually(t, 10*time.Second, func() bool { return runningA.Load() > 0 }, "worker A runs nothing")
	proxy.Cut()
	cutAt := time.Now()
	b.start() // worker B takes A's rows over once their leases are gone
	for _, id := range first {
		b.waitStatus(id, "done", 20*time.Second)
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	require.NoError(t, b.eng.Stop(stopCtx))
	cancel()

	proxy.Heal()
	healAt := time.Now()
	var second []int64
	for i := range 6 {
		second = append(second, b.insert(jobB.New(orderArgs{I: 100 + i})))
	}
	for _, id := range second {
		b.waitStatus(id, "done", 20*time.Second)
	}
	t.Logf("cut for %s; the new rows done %s after the heal", healAt.Sub(cutAt).Round(time.Millisecond), time.Since(healAt).Round(time.Millisecond))

	mu.Lock()
	defer mu.Unlock()
	for _, id := range second {
		rs := runs[id]
		require.NotEmpty(t, rs)
		require.Equal(t, "A", rs[len(rs)-1].worker, "instance %d: only A was working after the heal", id)
	}
	// A's runs in flight at the cut ended — their work done, or cancelled
	// by A's own lease deadline, a lease at most after the cut — before B's
	// rerun of the same instance began.
	cutRuns := 0
	for id, rs := range runs {
		for _, a := range rs {
			if a.worker != "A" || a.end.Before(cutAt) || !a.start.Before(cutAt) {
				continue
			}
			cutRuns++
			require.Less(t, a.end.Sub(cutAt), time.Second+250*time.Millisecond, "instance %d: A's run in flight at the cut went on past its lease", id)
			for _, o := range rs {
				if o.worker == "B" {
					require.True(t, a.end.Before(o.start), "instance %d: B's rerun started %s before A's cut run ended", id, a.end.Sub(o.start))
				}
			}
		}
	}
	require.Positive(t, cutRuns, "the cut caught no run of A in flight: the test proved nothing")
}

// TestWithTxIdleForALeaseCountsAnAttempt: the limit that frees a cut-off
// worker's locks also ends a callback that leaves its transaction idle —
// waiting on its own client, not on the database — for a whole lease while
// its worker is well. Running such a step again would end the same way, so
// it is the step's failure: it counts an attempt and says why, and the
// instance fails after its attempts instead of running forever.
func TestWithTxIdleForALeaseCountsAnAttempt(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	m := &gendurable.Machine[orderArgs]{
		Name: "idler", Start: "pay", MaxAttempts: 2,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				runs.Add(1)
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
						return err
					}
					select { // slow work of the client's own, the transaction open
					case <-time.After(2500 * time.Millisecond):
					case <-ctx.Done():
					}
					_, err := tx.Exec(ctx, "SELECT 2")
					return err
				}), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 300*time.Millisecond, 100*time.Millisecond
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(orderArgs{}))
	r := b.waitStatus(id, "failed", 20*time.Second)
	require.Equal(t, int32(2), runs.Load(), "two attempts, then failed: %v", r.Errors)
	require.Len(t, r.Errors, 2)
	for _, e := range r.Errors {
		require.Contains(t, e["error"], "left idle", "the error says what happened")
		require.NotEqual(t, "infrastructure", e["kind"], "the step's own failure, not the infrastructure's")
	}
}

// TestWithTxConnectionFailureCostsNoAttempt: the backend of a WithTx
// transaction is terminated (pg_terminate_backend, as an administrator or a
// failover would) while its callback runs. That is no failure of the step:
// with MaxAttempts 1 the instance must not fail; the step runs again without
// counting an attempt, and the error history and the StepEvent say
// "infrastructure".
func TestWithTxConnectionFailureCostsNoAttempt(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	var b *testBundle
	m := &gendurable.Machine[orderArgs]{
		Name: "terminated", Start: "pay",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				n := runs.Add(1)
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					if n > 1 {
						return nil
					}
					var pid int
					if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
						return err
					}
					if _, err := b.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
						return err
					}
					for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
						var alive bool
						if err := b.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive); err != nil {
							return err
						}
						if !alive {
							break
						}
					}
					_, err := tx.Exec(ctx, "SELECT 1")
					return err
				}), nil
			},
		},
	}
	events := &eventLog{}
	cfg := fastConfig("", m)
	cfg.Hooks = []gendurable.Hook{events}
	b = setup(t, cfg)
	b.start()
	res, err := b.eng.Insert(context.Background(), m.New(orderArgs{}).With(gendurable.InsertOpts{MaxAttempts: 1}))
	require.NoError(t, err)

	eventually(t, 20*time.Second, func() bool { return gendurable.Status(b.row(res.ID).Status).Terminal() }, "instance not finished")
	r := b.row(res.ID)
	require.Equal(t, "done", r.Status, "errors: %v", r.Errors)
	require.Equal(t, 0, r.Attempt)
	require.Equal(t, int32(2), runs.Load())
	require.Len(t, r.Errors, 1)
	require.Equal(t, "infrastructure", r.Errors[0]["kind"], "%v", r.Errors)
	ev, ok := findEvent(events, func(e *gendurable.StepEvent) bool { return e.InstanceID == res.ID && e.Err != nil })
	require.True(t, ok, "no StepEvent with the error")
	require.True(t, errors.Is(ev.Err, gendurable.ErrInfrastructure), "StepEvent.Err = %v", ev.Err)
	require.Equal(t, "replay", ev.Outcome)
}

// TestWithTxOnASilentlyDeadConnectionRunsAgain: the server session of a
// WithTx transaction ends while its connection, seen from the client, just
// goes quiet (half-open, as after a failover): no error ever arrives. The
// claim is heartbeated on other connections, so only a check of the session
// itself can tell: the step must run again, without counting an attempt,
// instead of waiting forever.
func TestWithTxOnASilentlyDeadConnectionRunsAgain(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	var admin *pgxpool.Pool
	m := &gendurable.Machine[orderArgs]{
		Name: "halfopen", Start: "pay",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				n := runs.Add(1)
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					if n > 1 {
						return nil
					}
					pid := tx.Conn().PgConn().PID()
					tx.Conn().PgConn().Conn().(*quietConn).silence()
					if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", int64(pid)); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "SELECT 1") // no answer, ever
					return err
				}), nil
			},
		},
	}
	admin, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2, Extra: 8})
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	pcfg.MaxConns = 8
	dialer := &net.Dialer{}
	pcfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &quietConn{Conn: c}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := fastConfig(schema, m)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 300*time.Millisecond, 100*time.Millisecond
	cfg.Logger = testLogger(t)
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	b := &testBundle{t: t, pool: admin, schema: schema, eng: eng}
	b.start()
	res, err := eng.Insert(context.Background(), m.New(orderArgs{}).With(gendurable.InsertOpts{MaxAttempts: 1}))
	require.NoError(t, err)

	r := b.waitStatus(res.ID, "done", 15*time.Second)
	require.Equal(t, 0, r.Attempt)
	require.Equal(t, int32(2), runs.Load())
	require.Len(t, r.Errors, 1)
	// The dead connection's error, or — on a loaded machine, where the 1 s
	// lease's heartbeat can time out first — the lease lost meanwhile:
	// either way the step ran again, no attempt counted.
	require.Contains(t, []any{"infrastructure", "interrupted"}, r.Errors[0]["kind"], "%v", r.Errors)
}

// quietConn is a connection that can be silenced: from then on writes are
// swallowed and reads wait for their deadline (or Close), as on a TCP
// connection whose peer vanished without a word.
type quietConn struct {
	net.Conn
	mu       sync.Mutex
	quiet    bool
	closed   bool
	deadline time.Time
}

func (c *quietConn) silence() {
	c.mu.Lock()
	c.quiet = true
	c.mu.Unlock()
}

func (c *quietConn) state() (quiet, closed bool, deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.quiet, c.closed, c.deadline
}

func (c *quietConn) Read(p []byte) (int, error) {
	if quiet, _, _ := c.state(); !quiet {
		return c.Conn.Read(p)
	}
	for {
		_, closed, deadline := c.state()
		switch {
		case closed:
			return 0, net.ErrClosed
		case !deadline.IsZero() && time.Now().After(deadline):
			return 0, os.ErrDeadlineExceeded
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *quietConn) Write(p []byte) (int, error) {
	if quiet, closed, _ := c.state(); quiet {
		if closed {
			return 0, net.ErrClosed
		}
		if len(p) > 0 && p[0] == 'X' { // Terminate: the pool gives the connection up; don't keep it waiting
			c.mu.Lock()
			c.closed = true
			c.mu.Unlock()
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *quietConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *quietConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *quietConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return c.Conn.Close()
}

// expireAndReap makes the lease of instance id run out, as if its worker had
// stalled past it, and reaps it with the engine's reaper. The worker's
// heartbeat still runs, though: one that lands between the two statements
// finds the lapsed lease still holding its token (nobody reaped it yet) and
// extends it again, and the reap then finds nothing. So both are repeated
// until the reaper has recovered the row.
func (b *testBundle) expireAndReap(id int64) {
	b.t.Helper()
	// As a worker stalled with its step running: a heartbeat has confirmed
	// the claim. One no heartbeat confirmed goes back uncharged, once per
	// step (docs/design.md §4, "Claims no heartbeat confirmed").
	eventually(b.t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
			WHERE id = $1 AND status = 'executing' AND unstarted_token IS DISTINCT FROM -1`, id) == 1
	}, "instance %d: no heartbeat confirmed its claim", id)
	eventually(b.t, 10*time.Second, func() bool {
		b.exec(`UPDATE {{s}}.gendurable_instances SET lease_expires_at = now() - interval '1 second'
		        WHERE id = $1 AND status = 'executing'`, id)
		n, err := b.eng.Reap(context.Background())
		require.NoError(b.t, err)
		require.LessOrEqual(b.t, n, 1, "only instance %d is executing", id)
		return n == 1
	}, "instance %d: its lease was never reaped", id)
}

func TestHeartbeatKeepsLongStepAlivePastLease(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{
		Name: "long",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			select {
			case <-time.After(2 * time.Second): // four leases long
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		},
	}
	b := setup(t, nil, job)
	cfg := b.eng.Config()
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = 500*time.Millisecond, 150*time.Millisecond, 50*time.Millisecond
	eng, err := gendurable.New(b.pool, &cfg)
	require.NoError(t, err)
	b.eng = eng
	b.start()
	id := b.insert(job.New(orderArgs{}))
	r := b.waitStatus(id, "done", 10*time.Second)
	require.Equal(t, 0, r.Attempt, "never reaped")
	require.Empty(t, r.Errors)
}

// An open transaction holding one instance's row lock (a SignalTx) does not
// stall the heartbeat of the others in the queue. (Before, the batched
// heartbeat waited on that lock and every lease of the queue expired.)
func TestLockedRowDoesNotStallTheHeartbeat(t *testing.T) {
	t.Parallel()
	started := make(chan int64, 2)
	job := &gendurable.Job[orderArgs]{Name: "slowbeat", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		started <- j.ID
		select {
		case <-time.After(3 * time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = 1500*time.Millisecond, 300*time.Millisecond, 100*time.Millisecond
	b := setup(t, cfg)
	b.start()
	ctx := context.Background()
	a := b.insert(job.New(orderArgs{I: 1}))
	other := b.insert(job.New(orderArgs{I: 2}))
	<-started
	<-started
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.eng.SignalTx(ctx, tx, a, "note", nil, nil) // holds a's row lock
	require.NoError(t, err)
	time.Sleep(2500 * time.Millisecond) // longer than the lease
	require.NoError(t, tx.Rollback(ctx))
	r := b.waitStatus(other, "done", 10*time.Second)
	require.Equal(t, 0, r.Attempt, "the other instance kept its lease")
	// The locked row itself could not be extended for longer than its lease,
	// so it may have been reaped once the lock went; it still finishes.
	b.waitStatus(a, "done", 10*time.Second)
}

func TestZombieOutcomeIsFencedOut(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var zombieCtxErr atomic.Value
	// Process A's step stalls and ignores its context, like a stopped process.
	stalled := &gendurable.Job[orderArgs]{
		Name: "fenced",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			close(started)
			<-release
			if cause := context.Cause(ctx); cause != nil {
				zombieCtxErr.Store(cause)
			}
			return nil // a late success: must change nothing
		},
	}
	logA := &eventLog{}
	a := setup(t, nil, stalled)
	cfgA := a.eng.Config()
	cfgA.Hooks = []gendurable.Hook{logA}
	cfgA.ReaperInterval = -1
	cfgA.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: -1, PollInterval: 20 * time.Millisecond}}
	cfgA.LeaseDuration, cfgA.HeartbeatInterval = 3*time.Second, 200*time.Millisecond
	engA, err := gendurable.New(a.pool, &cfgA)
	require.NoError(t, err)
	a.eng = engA
	a.start()
	id := a.insert(stalled.New(orderArgs{}))
	<-started

	// The lease runs out (as if A stalled past it) and the reaper recovers it.
	a.expireAndReap(id)

	// Process B runs the step again and finishes the instance.
	healthy := &gendurable.Job[orderArgs]{Name: "fenced", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		require.Equal(t, 1, j.Attempt, "the rerun counts the expired lease")
		return nil
	}}
	engB, err := gendurable.New(a.pool, fastConfig(a.schema, healthy))
	require.NoError(t, err)
	require.NoError(t, engB.Start(context.Background()))
	defer func() { _ = engB.Stop(context.Background()) }()
	done := a.waitStatus(id, "done", 10*time.Second)

	// A's heartbeat notices the lease is gone and cancels its step context.
	eventually(t, 5*time.Second, func() bool {
		_, ok := findEvent(logA, func(e *gendurable.LeaseLostEvent) bool { return e.InstanceID == id })
		return ok
	}, "A never noticed its lease was lost")

	close(release) // the zombie finishes late
	ev := func() *gendurable.StepEvent {
		var ev *gendurable.StepEvent
		eventually(t, 5*time.Second, func() bool {
			var ok bool
			ev, ok = findEvent(logA, func(e *gendurable.StepEvent) bool { return e.InstanceID == id })
			return ok
		}, "zombie step never reported")
		return ev
	}()
	require.True(t, ev.Fenced, "the zombie's outcome was rejected by the fence")
	require.ErrorIs(t, zombieCtxErr.Load().(error), gendurable.ErrLeaseLost)
	after := a.row(id)
	require.Equal(t, done.FinishedAt, after.FinishedAt, "the row is exactly as B left it")
	require.Equal(t, done.Attempt, after.Attempt)
	require.Len(t, after.Errors, 1)
	require.Equal(t, "lease_expired", after.Errors[0]["kind"])
}

// TestZombieReturnDoesNotDropTheNewClaim: the same process claims an
// instance again after its first run's lease was reaped; when the stale run
// finally returns, the new run must keep its heartbeat (and so its lease).
func TestZombieReturnDoesNotDropTheNewClaim(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	firstStarted, releaseFirst, secondStarted := make(chan struct{}), make(chan struct{}), make(chan struct{})
	job := &gendurable.Job[orderArgs]{
		Name: "rerun",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			switch runs.Add(1) {
			case 1:
				close(firstStarted)
				<-releaseFirst // a stall that ignores the context
				return nil
			default:
				close(secondStarted)
				time.Sleep(2500 * time.Millisecond) // several leases long
				return nil
			}
		},
	}
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = time.Second, 200*time.Millisecond, -1
	b := setup(t, cfg)
	b.start()
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(releaseFirst) }) }) // before the engine stops
	id := b.insert(job.New(orderArgs{}))
	<-firstStarted
	b.expireAndReap(id)
	select {
	case <-secondStarted:
	case <-time.After(10 * time.Second):
		t.Fatalf("instance %d was reaped but never ran again: %+v", id, b.row(id))
	}
	release.Do(func() { close(releaseFirst) }) // the zombie returns while the second run is in flight

	// Reap often while the second run lasts: its lease must stay alive.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		_, err := b.eng.Reap(context.Background())
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond)
	}
	r := b.waitStatus(id, "done", 10*time.Second)
	require.Equal(t, 1, r.Attempt, "reaped once (the stall), never the live second run")
	require.Equal(t, int32(2), runs.Load())
}

// TestNoFalseLeaseLossWhileOutcomesCommit: a heartbeat that runs while an
// outcome commits no longer finds the claim (the row just finished). That
// is no lost lease: nothing may be reported or cancelled. With no reaper
// and no other process, no lease can really be lost here.
func TestNoFalseLeaseLossWhileOutcomesCommit(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "quick", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	var lost atomic.Int64
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = 3*time.Second, 5*time.Millisecond, -1
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 16, PollInterval: 10 * time.Millisecond}}
	cfg.Hooks = []gendurable.Hook{gendurable.HookFunc(func(_ context.Context, ev gendurable.Event) {
		if _, ok := ev.(*gendurable.LeaseLostEvent); ok {
			lost.Add(1)
		}
	})}
	b := setup(t, cfg)
	ps := make([]gendurable.InsertParams, 3000)
	for i := range ps {
		ps[i] = job.New(orderArgs{})
	}
	_, err := b.eng.InsertMany(context.Background(), ps)
	require.NoError(t, err)
	b.start()
	eventually(t, 2*time.Minute, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`) == len(ps)
	}, "all jobs done")
	require.Zero(t, lost.Load(), "lease-lost events with no reaper and no other process")
}

// crashy is the machine of the kill -9 test: in the helper process its step
// hangs; in the test process it succeeds, counting Handle calls.
var crashyHandleCalls atomic.Int32

func crashyMachine(hang bool) *gendurable.Machine[orderArgs] {
	return &gendurable.Machine[orderArgs]{
		Name: "crashy", Start: "work",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"work": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				if hang {
					// GENDURABLE_HELPER_STARTED: say that the step of this
					// claim started (a file named after the token).
					if p := os.Getenv("GENDURABLE_HELPER_STARTED"); p != "" {
						_ = os.WriteFile(fmt.Sprintf("%s.%d", p, r.Token), nil, 0o600)
					}
					select {} // killed here
				}
				return gendurable.Done(map[string]int{"attempt": r.Attempt}), nil
			},
		},
		Handle: func(ctx context.Context, r *gendurable.Run[orderArgs], err error) (gendurable.Outcome, error) {
			crashyHandleCalls.Add(1)
			return gendurable.Stop("handle must not be called for a crash"), nil
		},
	}
}

// startHelperWorker starts TestHelperWorkerProcess on schema (env: more
// variables for it) and returns a func that kills it with SIGKILL and
// waits for it; the process is killed when the test ends in any case.
func startHelperWorker(t *testing.T, schema string, env ...string) (kill func()) {
	t.Helper()
	_, kill = startHelperWorkerCmd(t, schema, env...)
	return kill
}

// startHelperWorkerCmd is startHelperWorker, with the process too (to stop
// and continue it).
func startHelperWorkerCmd(t *testing.T, schema string, env ...string) (cmd *exec.Cmd, kill func()) {
	t.Helper()
	cmd = exec.Command(os.Args[0], "-test.run=^TestHelperWorkerProcess$")
	cmd.Env = append(append(os.Environ(), "GENDURABLE_HELPER_SCHEMA="+schema), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	var once sync.Once
	kill = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_, _ = cmd.Process.Wait()
		})
	}
	t.Cleanup(kill)
	return cmd, kill
}

// TestHelperWorkerProcess is not a test: it is the worker process that
// TestReapKilledWorkerProcess and TestKilledWorkersPrefetchedClaimsCostNoAttempt
// start and kill. With GENDURABLE_HELPER_PREFETCH set, one step runs (and
// hangs) while eight more claims wait in its buffer. With
// GENDURABLE_HELPER_SLOW_BEAT set, its lease is 6 s and its heartbeat 2 s
// (else 1 s and 200 ms); with GENDURABLE_HELPER_STARTED=path, each step
// writes the file path.TOKEN as it starts.
func TestHelperWorkerProcess(t *testing.T) {
	schema := os.Getenv("GENDURABLE_HELPER_SCHEMA")
	if schema == "" {
		t.Skip("helper process only")
	}
	qc := gendurable.QueueConfig{PollInterval: 20 * time.Millisecond}
	if os.Getenv("GENDURABLE_HELPER_PREFETCH") != "" {
		qc.Concurrency, qc.Prefetch = 1, 8
	}
	// A short lease kept alive by heartbeats while this process lives.
	lease, beat := time.Second, 200*time.Millisecond
	if os.Getenv("GENDURABLE_HELPER_SLOW_BEAT") != "" {
		lease, beat = 6*time.Second, 2*time.Second
	}
	serveHelper(func(*pgxpool.Pool) *gendurable.Config {
		return &gendurable.Config{
			Schema:        schema,
			Machines:      []gendurable.Definition{crashyMachine(true)},
			Queues:        map[string]gendurable.QueueConfig{"default": qc},
			LeaseDuration: lease, HeartbeatInterval: beat, ReaperInterval: -1,
		}
	})
}

// serveHelper runs, in a helper process, an engine configured by cfg until
// the process is killed; a failure to start exits with a code of its own.
func serveHelper(cfg func(*pgxpool.Pool) *gendurable.Config) {
	pool, err := pgxpool.New(context.Background(), dbtest.URL())
	if err != nil {
		os.Exit(3)
	}
	eng, err := gendurable.New(pool, cfg(pool))
	if err != nil {
		os.Exit(4)
	}
	if err := eng.Start(context.Background()); err != nil {
		os.Exit(5)
	}
	select {} // until SIGKILL
}

func TestReapKilledWorkerProcess(t *testing.T) {
	t.Parallel()
	m := crashyMachine(false)
	b := setup(t, nil, m)
	id := b.insert(m.New(orderArgs{}))

	kill := startHelperWorker(t, b.schema)
	eventually(t, 20*time.Second, func() bool { return b.row(id).Status == "executing" }, "worker never claimed the row")

	// Alive, the worker's heartbeats hold the lease well past its length.
	time.Sleep(2 * time.Second)
	r := b.row(id)
	require.Equal(t, "executing", r.Status)
	require.True(t, r.LeaseExp.After(r.Now), "lease was extended by heartbeats")
	token := *r.Token

	kill()

	// This process reaps the expired lease and runs the step again.
	b.start()
	r = b.waitStatus(id, "done", 15*time.Second)
	require.Equal(t, 1, r.Attempt, "the crash counted one attempt")
	require.JSONEq(t, `{"attempt":1}`, string(r.Result))
	require.Len(t, r.Errors, 1)
	require.Equal(t, "lease_expired", r.Errors[0]["kind"])
	require.Zero(t, crashyHandleCalls.Load(), "a crash is not a handled error")
	require.Nil(t, r.Token)
	require.NotEqual(t, int64(0), token)
}

// TestAWorkerKilledBeforeItsFirstHeartbeatCostsNoAttemptOncePerStep
// (docs/design.md §4, "Claims no heartbeat confirmed"): a worker process
// claims an instance of MaxAttempts 1 and starts its step (which hangs; it
// writes a file named after its claim's token first, which the test
// waits for); it is stopped and killed before its first heartbeat, so the claim still
// carries the mark every claim is written with (-1). The reaper returns it
// uncharged, its entry saying no heartbeat confirmed the step. A second
// worker claims it again and is killed the same way: the step has gone
// free once, so this loss is charged, and the instance fails, attempts
// exhausted — its step having started twice (MaxAttempts + 1). Before
// schema version 24 the first loss failed it.
func TestAWorkerKilledBeforeItsFirstHeartbeatCostsNoAttemptOncePerStep(t *testing.T) {
	t.Parallel()
	m := crashyMachine(false)
	b := setup(t, nil, m)
	id := b.insert(m.New(orderArgs{}).With(gendurable.InsertOpts{MaxAttempts: 1}))
	ctx := context.Background()
	marker := filepath.Join(t.TempDir(), "started")
	lose := func(round int) {
		t.Helper()
		cmd, kill := startHelperWorkerCmd(t, b.schema, "GENDURABLE_HELPER_SLOW_BEAT=1", "GENDURABLE_HELPER_STARTED="+marker)
		eventually(t, 20*time.Second, func() bool {
			r := b.row(id)
			if r.Status != "executing" || r.Token == nil {
				return false
			}
			_, err := os.Stat(fmt.Sprintf("%s.%d", marker, *r.Token))
			return err == nil
		}, "the worker never started the row's step")
		require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
		eventually(t, 5*time.Second, func() bool { return childproc.Stopped(cmd.Process.Pid) }, "the worker did not stop")
		time.Sleep(100 * time.Millisecond) // a statement sent before the stop has ended
		require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND unstarted_token = -1`, id),
			"round %d: a heartbeat ran before the worker was stopped (its first comes 2 s after its start)", round)
		kill()
		b.exec(`UPDATE {{s}}.gendurable_instances SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, id) // the 6 s lease, run out
		n, err := b.eng.Reap(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	lose(1)
	r := b.row(id)
	require.Equal(t, "runnable", r.Status)
	require.Equal(t, 0, r.Attempt, "the first loss is not charged")
	require.Len(t, r.Errors, 1)
	require.Equal(t, true, r.Errors[0]["uncharged"])
	require.Contains(t, r.Errors[0]["error"], "before any heartbeat confirmed the step started")
	inst, err := b.eng.Instance(ctx, id)
	require.NoError(t, err)
	require.True(t, inst.Errors[0].Uncharged && inst.Errors[0].Unconfirmed, "StepError: %+v", inst.Errors[0])

	lose(2)
	r = b.row(id)
	require.Equal(t, "failed", r.Status, "the second loss of the step is charged")
	require.Equal(t, 0, r.Attempt)
	require.Len(t, r.Errors, 2)
	require.Nil(t, r.Errors[1]["uncharged"])
	require.Nil(t, r.Errors[1]["unconfirmed"])
	require.Contains(t, r.Errors[1]["error"], "attempts exhausted")
	require.Zero(t, crashyHandleCalls.Load(), "a crash is not a handled error")
}

// prefetchingHelper inserts nine instances of crashyMachine with
// MaxAttempts 1 and starts TestHelperWorkerProcess with one running slot
// and eight of prefetch (its step hangs); it returns once every row is
// claimed and a heartbeat since has marked the eight buffered claims as
// not started.
func prefetchingHelper(t *testing.T) (b *testBundle, cmd *exec.Cmd, kill func()) {
	t.Helper()
	m := crashyMachine(false)
	b = setup(t, nil, m)
	ps := make([]gendurable.InsertParams, 9)
	for i := range ps {
		ps[i] = m.New(orderArgs{I: i}).With(gendurable.InsertOpts{MaxAttempts: 1})
	}
	_, err := b.eng.InsertMany(context.Background(), ps)
	require.NoError(t, err)
	cmd, kill = startHelperWorkerCmd(t, b.schema, "GENDURABLE_HELPER_PREFETCH=1")
	eventually(t, 20*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`) == 9 &&
			b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing' AND unstarted_token = claim_token`) == 8
	}, "the worker never held nine claims with eight of them marked unstarted")
	return b, cmd, kill
}

// TestKilledWorkersPrefetchedClaimsCostNoAttempt (docs/design.md §4,
// "Prefetched claims"): a worker process holding nine claims of
// MaxAttempts 1 — one step running, eight prefetched and never started —
// is killed with SIGKILL. The running step's lost run is charged its one
// attempt (the instance fails, attempts exhausted); the eight prefetched
// rows go back to runnable uncharged and run to done in this process on
// their first attempt. Before schema version 17 all nine failed.
func TestKilledWorkersPrefetchedClaimsCostNoAttempt(t *testing.T) {
	t.Parallel()
	b, _, kill := prefetchingHelper(t)
	kill()

	// This process reaps the expired leases and runs what is left.
	b.start()
	eventually(t, 20*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status IN ('done', 'failed')`) == 9
	}, "not every instance finished")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE status = 'failed' AND attempt = 0 AND jsonb_array_length(errors) = 1
		  AND errors -> 0 @> '{"kind": "lease_expired"}' AND NOT errors -> 0 ? 'uncharged'
		  AND errors -> 0 ->> 'error' LIKE '%attempts exhausted'`), "the running step's lost run is charged")
	require.Equal(t, 8, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE status = 'done' AND attempt = 0 AND result = '{"attempt": 0}' AND jsonb_array_length(errors) = 1
		  AND errors -> 0 @> '{"kind": "lease_expired", "uncharged": true}'`), "the prefetched rows ran on their first attempt")
}

// TestStoppedWorkerHandsBackItsPrefetchedClaims (docs/design.md §4,
// "Prefetched claims"): a worker process holding one hung step and eight
// prefetched claims of MaxAttempts 1 is stopped (SIGSTOP) for 2.5 leases,
// then continued. On waking it gives the eight claims up — their leases may
// have run out on the database clock — and hands them straight back to
// runnable under their own tokens, no attempt counted, no error recorded:
// no reaper runs anywhere in this test. Before, it only dropped them, and
// they stayed executing under claims nobody held until a reaper charged
// them (or, unmarked, failed them).
func TestStoppedWorkerHandsBackItsPrefetchedClaims(t *testing.T) {
	t.Parallel()
	b, cmd, _ := prefetchingHelper(t)
	ctx := context.Background()
	rows, err := b.pool.Query(ctx, replaceSchema(`SELECT id, claim_token FROM {{s}}.gendurable_instances
		WHERE status = 'executing' AND unstarted_token = claim_token`, b.schema))
	require.NoError(t, err)
	type claim struct{ id, token int64 }
	buffered, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claim, error) {
		var c claim
		return c, r.Scan(&c.id, &c.token)
	})
	require.NoError(t, err)
	require.Len(t, buffered, 8)

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	eventually(t, 5*time.Second, func() bool { return childproc.Stopped(cmd.Process.Pid) }, "the worker did not stop")
	time.Sleep(2500 * time.Millisecond) // the helper's lease is 1 s
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))

	// Every buffered claim is handed back: its row is no longer executing
	// under that token (it may have been claimed again since), with no
	// attempt counted and nothing in its error history.
	ids := make([]int64, len(buffered))
	tokens := make([]int64, len(buffered))
	for i, c := range buffered {
		ids[i], tokens[i] = c.id, c.token
	}
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances AS i
			JOIN unnest($1::bigint[], $2::bigint[]) AS c(id, token) ON c.id = i.id
			WHERE i.claim_token IS DISTINCT FROM c.token AND i.attempt = 0 AND i.errors = '[]'::jsonb
			  AND i.status IN ('runnable', 'executing')`, ids, tokens) == 8
	}, "the stopped worker's prefetched claims were not handed back on waking")
}

// TestAStepNeverRunsUnderANotStartedMark (docs/design.md §4, "Prefetched
// claims"): with one running slot, steps of 300 ms and heartbeats every
// 100 ms, claims wait in the buffer across heartbeats that mark them not
// started (all but the first). Each step reads its own row as it starts:
// the mark must be gone (cleared before dispatch), or a crash now would
// return a run that did start to runnable without charging it. The test
// requires that some claim was seen marked, or it proves nothing.
func TestAStepNeverRunsUnderANotStartedMark(t *testing.T) {
	t.Parallel()
	var pool atomic.Pointer[pgxpool.Pool]
	var schema string
	var marked, seen atomic.Int32
	job := &gendurable.Job[orderArgs]{Name: "markcheck", Perform: func(ctx context.Context, r *gendurable.Run[orderArgs]) error {
		var mark *int64
		if err := pool.Load().QueryRow(ctx, `SELECT unstarted_token FROM `+pgx.Identifier{schema}.Sanitize()+`.gendurable_instances WHERE id = $1`, r.ID).Scan(&mark); err != nil {
			return err
		}
		if mark != nil && *mark == r.Token {
			marked.Add(1)
		}
		seen.Add(1)
		time.Sleep(300 * time.Millisecond)
		return nil
	}}
	cfg := fastConfig("", job)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: 6, PollInterval: 20 * time.Millisecond}}
	cfg.HeartbeatInterval = 100 * time.Millisecond
	b := setup(t, cfg)
	pool.Store(b.pool)
	schema = b.schema
	ctx := context.Background()
	ps := make([]gendurable.InsertParams, 7)
	for i := range ps {
		ps[i] = job.New(orderArgs{I: i})
	}
	_, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	// Watch the marks the heartbeats leave while the claims wait.
	var sawMarks atomic.Bool
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var n int
			if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema}.Sanitize()+`.gendurable_instances
				WHERE status = 'executing' AND unstarted_token = claim_token`).Scan(&n); err == nil && n > 0 {
				sawMarks.Store(true)
			}
		}
	}()
	b.start()
	eventually(t, 20*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`) == len(ps)
	}, "not every job finished")
	close(stop)
	<-watched
	require.True(t, sawMarks.Load(), "no claim was ever marked not started: the test proves nothing")
	require.EqualValues(t, len(ps), seen.Load())
	require.Zero(t, marked.Load(), "a step started while its claim was marked not started")
}

func TestReaperFailsAfterMaxAttemptsOfExpiredLeases(t *testing.T) {
	t.Parallel()
	m := crashyMachine(false)
	b := setup(t, nil, m)
	res, err := b.eng.Insert(context.Background(), m.New(orderArgs{}).With(gendurable.InsertOpts{MaxAttempts: 2}))
	require.NoError(t, err)
	id := res.ID
	// Two claims whose workers vanished.
	for i := 0; i < 2; i++ {
		b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'executing', claim_token = 99,
		        lease_expires_at = now() - interval '1 second' WHERE id = $1`, id)
		n, err := b.eng.Reap(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	r := b.row(id)
	require.Equal(t, "failed", r.Status, "no poison loop: failed after max attempts")
	// It failed on its second attempt, and says so as a step that returned
	// an error on it would (Attempt+1 = MaxAttempts; it said 3 of 2).
	require.Equal(t, 1, r.Attempt)
	require.Len(t, r.Errors, 2)
	require.EqualValues(t, 0, r.Errors[0]["attempt"])
	require.EqualValues(t, 1, r.Errors[1]["attempt"])
	require.Contains(t, r.Errors[1]["error"], "attempts exhausted")
	require.NotNil(t, r.FinishedAt)
}

// TestReapedRowKeepsItsPlaceInTheBacklog: a reaped row goes back to
// runnable with its original eligible_at, so it runs before the rows that
// became eligible after it, not after the whole backlog.
func TestReapedRowKeepsItsPlaceInTheBacklog(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []int64
	job := &gendurable.Job[orderArgs]{
		Name: "backlog",
		Perform: func(_ context.Context, j *gendurable.Run[orderArgs]) error {
			mu.Lock()
			order = append(order, j.ID)
			mu.Unlock()
			return nil
		},
	}
	cfg := fastConfig("", job)
	cfg.ReaperInterval = -1
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: -1, PollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	reaped := b.insert(job.New(orderArgs{}))
	var backlog []int64
	for range 5 {
		backlog = append(backlog, b.insert(job.New(orderArgs{})))
	}
	// The first row became eligible an hour ago and was claimed by a worker
	// that died; the backlog became eligible a minute ago.
	b.exec(`UPDATE {{s}}.gendurable_instances SET eligible_at = now() - interval '1 minute' WHERE id <> $1`, reaped)
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'executing', eligible_at = now() - interval '1 hour',
	          claim_token = nextval('{{s}}.gendurable_claim_token_seq'), lease_expires_at = now() - interval '1 second'
	        WHERE id = $1`, reaped)
	before := b.row(reaped).EligibleAt

	n, err := b.eng.Reap(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	r := b.row(reaped)
	require.Equal(t, "runnable", r.Status)
	require.Equal(t, 1, r.Attempt)
	require.WithinDuration(t, before, r.EligibleAt, time.Millisecond, "the reap moved the row's eligible_at")

	b.start()
	for _, id := range backlog {
		b.waitStatus(id, "done", 20*time.Second)
	}
	b.waitStatus(reaped, "done", 20*time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, reaped, order[0], "the reaped row ran after the backlog: %v", order)
}

// pausedMachine records each start of its step (instance, attempt, and the
// time it was entered, before any wait for a connection) in table starts,
// then works for 300ms.
func pausedMachine(pool *pgxpool.Pool, schema string) *gendurable.Machine[orderArgs] {
	return &gendurable.Machine[orderArgs]{
		Name: "paused", Start: "work",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"work": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				entered := time.Now()
				if pool != nil {
					if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".starts VALUES ($1, $2, $3, $4)", r.ID, r.Attempt, entered, r.Token); err != nil {
						return gendurable.Outcome{}, err
					}
				}
				time.Sleep(300 * time.Millisecond)
				return gendurable.Done(nil), nil
			},
		},
	}
}

// TestHelperPausedWorkerProcess is not a test: it is the worker process
// that TestPausedWorkerStartsNoReapedClaim stops and continues.
func TestHelperPausedWorkerProcess(t *testing.T) {
	schema := os.Getenv("GENDURABLE_PAUSE_SCHEMA")
	if schema == "" {
		t.Skip("helper process only")
	}
	serveHelper(func(pool *pgxpool.Pool) *gendurable.Config {
		return &gendurable.Config{
			Schema:        schema,
			Machines:      []gendurable.Definition{pausedMachine(pool, schema)},
			Queues:        map[string]gendurable.QueueConfig{"default": {Concurrency: 3, Prefetch: 10, PollInterval: 20 * time.Millisecond}},
			LeaseDuration: 1500 * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond, ReaperInterval: -1,
		}
	})
}

// TestPausedWorkerStartsNoReapedClaim: a worker holding prefetched claims
// is paused (SIGSTOP) past its lease; meanwhile the claims are reaped. When
// it continues, it must not start any of them before a heartbeat has told
// it which are still its own: they may already run elsewhere.
func TestPausedWorkerStartsNoReapedClaim(t *testing.T) {
	t.Parallel()
	m := pausedMachine(nil, "") // this process only inserts and reaps
	b := setup(t, nil, m)
	b.exec(`CREATE TABLE {{s}}.starts (id bigint, attempt int, at timestamptz, token bigint)`)
	for range 10 {
		b.insert(m.New(orderArgs{}))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPausedWorkerProcess$")
	cmd.Env = append(os.Environ(), "GENDURABLE_PAUSE_SCHEMA="+b.schema)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
	eventually(t, 20*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.starts`) >= 1 &&
			b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`) >= 5
	}, "the worker never ran a step with claims prefetched")

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(2500 * time.Millisecond) // past the lease
	reaped, err := b.eng.Reap(context.Background())
	require.NoError(t, err)
	require.GreaterOrEqual(t, reaped, 5, "the paused worker's claims were reaped")
	continued := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	time.Sleep(1500 * time.Millisecond)

	// A start under a claim the reaper took (its lease_expired entry names
	// the claim's token). Not by attempt: a reaped claim no heartbeat had
	// confirmed goes back uncharged (schema version 24), and the worker
	// may claim it again, rightly, at the same attempt.
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.starts AS s
		JOIN {{s}}.gendurable_instances AS i ON i.id = s.id
		CROSS JOIN LATERAL jsonb_array_elements(i.errors) AS e
		WHERE s.at > $1 AND e ->> 'kind' = 'lease_expired' AND (e ->> 'token')::bigint = s.token`, continued),
		"after the pause the worker started steps of claims that had been reaped meanwhile")
}

func TestGracefulDrain(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}, 10), make(chan struct{})
	job := &gendurable.Job[orderArgs]{
		Name: "drain",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			started <- struct{}{}
			<-release // ignores ctx: finishes within the drain timeout
			return nil
		},
	}
	log := &eventLog{}
	cfg := &gendurable.Config{
		Machines: []gendurable.Definition{job},
		Hooks:    []gendurable.Hook{log},
		// A long lease: only the drain can hand the prefetched rows back quickly.
		LeaseDuration: time.Minute, HeartbeatInterval: 10 * time.Second, DrainTimeout: 10 * time.Second,
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: 5, PollInterval: 20 * time.Millisecond}},
	}
	b := setup(t, cfg)
	ctx := context.Background()
	var ps []gendurable.InsertParams
	for i := 0; i < 4; i++ {
		ps = append(ps, job.New(orderArgs{I: i}))
	}
	_, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	require.NoError(t, b.eng.Start(ctx))
	<-started
	eventually(t, 5*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`) == 4
	}, "prefetch did not claim the rest")

	stopped := make(chan error, 1)
	go func() { stopped <- b.eng.Stop(ctx) }()
	// The three prefetched rows go back at once, while the running one drains.
	eventually(t, 5*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
		                WHERE status = 'runnable' AND claim_token IS NULL AND attempt = 0`) == 3
	}, "prefetched rows were not released")
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) before the in-flight step finished", err)
	default:
	}
	close(release)
	require.NoError(t, <-stopped)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`))
	ev, ok := findEvent(log, func(*gendurable.DrainEvent) bool { return true })
	require.True(t, ok)
	require.Equal(t, 3, ev.Released)
	require.True(t, ev.Completed)
}

// TestStopWithAContextAlreadyDoneReleasesPrefetchedRows: Stop called with
// a context that is already done (a signal's context, say) abandons the
// running step at once, but still hands its prefetched rows back on a
// database that answers: they are runnable again at once, not executing
// until a lease (a minute here) runs out.
func TestStopWithAContextAlreadyDoneReleasesPrefetchedRows(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 10)
	job := &gendurable.Job[orderArgs]{
		Name: "donectx",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			started <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		},
	}
	log := &eventLog{}
	cfg := &gendurable.Config{
		Machines:      []gendurable.Definition{job},
		Hooks:         []gendurable.Hook{log},
		LeaseDuration: time.Minute, HeartbeatInterval: 10 * time.Second, DrainTimeout: 10 * time.Second,
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: 5, PollInterval: 20 * time.Millisecond}},
	}
	b := setup(t, cfg)
	var ps []gendurable.InsertParams
	for i := 0; i < 4; i++ {
		ps = append(ps, job.New(orderArgs{I: i}))
	}
	_, err := b.eng.InsertMany(context.Background(), ps)
	require.NoError(t, err)
	require.NoError(t, b.eng.Start(context.Background()))
	<-started
	eventually(t, 5*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`) == 4
	}, "prefetch did not claim the rest")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// The running step returns at its cancel, within Stop's grace: nothing
	// is abandoned, so Stop reports nothing.
	require.NoError(t, b.eng.Stop(ctx))
	eventually(t, 5*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
		                WHERE status = 'runnable' AND claim_token IS NULL AND attempt = 0`) == 4
	}, "the prefetched rows (and the interrupted step's) were not handed back")
	ev, ok := findEvent(log, func(*gendurable.DrainEvent) bool { return true })
	require.True(t, ok)
	require.Equal(t, 3, ev.Released)
	require.False(t, ev.Completed, "the step was interrupted, not drained")
}

// TestStopWithAContextAlreadyDoneReportsAStepIgnoringIt: Stop called with a
// context that is already done cancels the running steps and waits for
// them for its grace (500 ms) only. A step that honours its cancel is not
// reported (TestStopWithAContextAlreadyDoneReleasesPrefetchedRows; it once
// was, always: the wait raced the done context); one that ignores it is,
// with an error wrapping the context's, and Stop does not wait for it.
func TestStopWithAContextAlreadyDoneReportsAStepIgnoringIt(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	b := startedOnADeafStep(t, release)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	t0 := time.Now()
	err := b.eng.Stop(ctx)
	took := time.Since(t0)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "ignoring cancellation")
	require.Less(t, took, 5*time.Second, "Stop waited past its grace for a step ignoring its context")
}

// TestConcurrentStopsBothWaitForTheEngine: a second Stop called while the
// first is draining a step waits for the first and returns its result; a
// Start called meanwhile waits too, then starts. The second Stop used to
// return nil at once, while the step still ran.
func TestConcurrentStopsBothWaitForTheEngine(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 2)
	release := make(chan struct{})
	var finished atomic.Int32
	job := &gendurable.Job[orderArgs]{
		Name: "draining",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			started <- struct{}{}
			if j.State.I == 0 {
				<-release
			}
			finished.Add(1)
			return nil
		},
	}
	cfg := fastConfig("", job)
	cfg.DrainTimeout = 30 * time.Second
	b := setup(t, cfg)
	b.insert(job.New(orderArgs{I: 0}))
	require.NoError(t, b.eng.Start(context.Background()))
	<-started

	first := make(chan error, 1)
	go func() { first <- b.eng.Stop(context.Background()) }()
	time.Sleep(100 * time.Millisecond) // the first Stop is draining
	second := make(chan error, 1)
	go func() { second <- b.eng.Stop(context.Background()) }()
	// The Start comes after the second Stop (one begun before a Stop is
	// ended by it: TestAStopEndsAStartWaitingItsTurn).
	time.Sleep(200 * time.Millisecond)
	restarted := make(chan error, 1)
	go func() { restarted <- b.eng.Start(context.Background()) }()
	select {
	case err := <-second:
		t.Fatalf("the second Stop returned (%v) while the first was still draining a step", err)
	case err := <-restarted:
		t.Fatalf("Start returned (%v) while a Stop was still draining a step", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.Equal(t, int32(0), finished.Load())
	close(release)
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	require.Equal(t, int32(1), finished.Load(), "the second Stop returned before the step it drained")
	require.NoError(t, <-restarted)
	// The restarted engine runs work.
	b.insert(job.New(orderArgs{I: 1}))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine started after the Stop ran nothing")
	}
	require.NoError(t, b.eng.Stop(context.Background()))
}

func TestDrainTimeoutCancelsStepsWithoutCountingAnAttempt(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 1)
	var cause atomic.Value
	job := &gendurable.Job[orderArgs]{
		Name: "slow",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			started <- struct{}{}
			<-ctx.Done()
			cause.Store(context.Cause(ctx))
			return ctx.Err()
		},
	}
	b := setup(t, nil, job)
	cfg := b.eng.Config()
	cfg.DrainTimeout = 100 * time.Millisecond
	logs := &syncbuf.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	evs := &eventLog{}
	cfg.Hooks = []gendurable.Hook{evs}
	eng, err := gendurable.New(b.pool, &cfg)
	require.NoError(t, err)
	id := b.insert(job.New(orderArgs{})) // inserted through b.eng: same registration
	require.NoError(t, eng.Start(context.Background()))
	<-started
	require.NoError(t, eng.Stop(context.Background()))
	require.True(t, errors.Is(cause.Load().(error), gendurable.ErrEngineStopped))
	r := b.row(id)
	require.Equal(t, "runnable", r.Status, "interrupted work runs again")
	require.Equal(t, 0, r.Attempt, "shutdown is not the step's failure")
	require.Equal(t, "interrupted", r.Errors[0]["kind"])
	// The step returned ctx.Err() (context.Canceled), not the cause: the log
	// says it was interrupted, not that it failed (a probe found the
	// warning "step failed … context canceled" for such steps).
	require.Contains(t, logs.String(), "step interrupted by Stop")
	require.NotContains(t, logs.String(), "step failed")
	ev, ok := findEvent(evs, func(e *gendurable.StepEvent) bool { return e.InstanceID == id })
	require.True(t, ok, "no step event")
	require.True(t, ev.Interrupted, "the hook is told it was no failure")
	require.ErrorIs(t, ev.Err, gendurable.ErrEngineStopped)
}

// TestDelayedRowsOfThisProcessRunOnTime: a retry's backoff, a Replay's
// delay, a durable sleep (Next.After), an insert's RunIn and an await's
// timeout end when they say, not at the next poll or sweep: the process
// that wrote the delay wakes its feeder (or its await-timeout sweep) then.
// Polls are 2 s apart and the sweep's interval 5 s here, so a late start
// would show. Gaps are measured on the database clock; the slack is for a
// loaded machine.
func TestDelayedRowsOfThisProcessRunOnTime(t *testing.T) {
	t.Parallel()
	var b *testBundle
	var mu sync.Mutex
	starts := map[string][]time.Time{}
	mark := func(ctx context.Context, what string) {
		var now time.Time
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now))
		mu.Lock()
		starts[what] = append(starts[what], now)
		mu.Unlock()
	}
	retry := &gendurable.Job[orderArgs]{Name: "ontime-retry", MaxAttempts: 5,
		Backoff: func(int) time.Duration { return 100 * time.Millisecond },
		Perform: func(ctx context.Context, r *gendurable.Run[orderArgs]) error {
			mark(ctx, "retry")
			if r.Attempt < 3 {
				return errors.New("not yet")
			}
			return nil
		}}
	sleeper := &gendurable.Machine[orderArgs]{Name: "ontime-sleep", Start: "a", Steps: map[string]gendurable.StepFunc[orderArgs]{
		"a": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			mark(ctx, "sleep")
			return r.Next("b", r.State).After(150 * time.Millisecond), nil
		},
		"b": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			mark(ctx, "sleep")
			return gendurable.Done(nil), nil
		},
	}}
	later := &gendurable.Job[orderArgs]{Name: "ontime-later", Perform: func(ctx context.Context, r *gendurable.Run[orderArgs]) error {
		mark(ctx, "later")
		return nil
	}}
	replayer := &gendurable.Machine[orderArgs]{Name: "ontime-replay", Start: "a", Steps: map[string]gendurable.StepFunc[orderArgs]{
		"a": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			mark(ctx, "replay")
			if r.State.I < 2 {
				return r.Replay(orderArgs{I: r.State.I + 1}, 100*time.Millisecond), nil
			}
			return gendurable.Done(nil), nil
		},
	}}
	awaiter := &gendurable.Machine[orderArgs]{Name: "ontime-await", Start: "a", Steps: map[string]gendurable.StepFunc[orderArgs]{
		"a": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			mark(ctx, "await")
			return r.Await("b", r.State, "never").Timeout(150 * time.Millisecond), nil
		},
		"b": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			mark(ctx, "await")
			if len(r.Awaited) != 0 {
				return gendurable.Stop("woken by a signal, not by the timeout"), nil
			}
			return gendurable.Done(nil), nil
		},
	}}
	// An await with a timeout written by a WithTx outcome: its deadline
	// counts from the transaction's start, and passes while the
	// transaction (800 ms) is still open.
	awaiterTx := &gendurable.Machine[orderArgs]{Name: "ontime-await-tx", Start: "a", Steps: map[string]gendurable.StepFunc[orderArgs]{
		"a": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			mark(ctx, "await-tx")
			return r.Await("b", r.State, "never").Timeout(600 * time.Millisecond).WithTx(func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT pg_sleep(0.8)`)
				return err
			}), nil
		},
		"b": func(ctx context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
			mark(ctx, "await-tx")
			return gendurable.Done(nil), nil
		},
	}}
	cfg := fastConfig("", retry, sleeper, later, replayer, awaiter, awaiterTx)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 4,
		BusyPollInterval: 2 * time.Second, PollInterval: 2 * time.Second, MaxPollInterval: 5 * time.Second}}
	// The sweep finds other processes' deadlines every 5 s: a local await's
	// timeout must not wait for that.
	cfg.ReaperInterval, cfg.AwaitTimeoutInterval = 5*time.Second, 5*time.Second
	b = setup(t, cfg)
	b.start()
	ids := []int64{b.insert(retry.New(orderArgs{})), b.insert(sleeper.New(orderArgs{})),
		b.insert(replayer.New(orderArgs{})), b.insert(awaiter.New(orderArgs{})), b.insert(awaiterTx.New(orderArgs{}))}
	var insertedAt time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&insertedAt))
	ids = append(ids, b.insert(later.New(orderArgs{}).With(gendurable.InsertOpts{RunIn: 150 * time.Millisecond})))
	for _, id := range ids {
		b.waitStatus(id, "done", 10*time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	gaps := func(ts []time.Time) (out []time.Duration) {
		for i := 1; i < len(ts); i++ {
			out = append(out, ts[i].Sub(ts[i-1]))
		}
		return out
	}
	// Late by up to 750 ms passes (a loaded machine made a 150 ms RunIn
	// 388 ms late, where 250 ms was allowed): polls come at a random phase
	// of their 2 s interval, so a delay that waited for one is later than
	// that in each gap with a chance of 62 %, and one of the run's eight
	// gaps shows it but for a chance of 4 in 10,000.
	check := func(what string, got []time.Duration, want time.Duration) {
		t.Logf("%s: %v apart (want %s)", what, got, want)
		for _, g := range got {
			require.GreaterOrEqual(t, g, want-10*time.Millisecond, "%s ran early", what)
			require.Less(t, g, want+750*time.Millisecond, "%s waited for a poll", what)
		}
	}
	require.Len(t, starts["retry"], 4)
	check("retry attempts (backoff 100ms)", gaps(starts["retry"]), 100*time.Millisecond)
	require.Len(t, starts["sleep"], 2)
	check("steps around Next.After(150ms)", gaps(starts["sleep"]), 150*time.Millisecond)
	require.Len(t, starts["later"], 1)
	check("RunIn 150ms from the insert", gaps([]time.Time{insertedAt, starts["later"][0]}), 150*time.Millisecond)
	require.Len(t, starts["replay"], 3)
	check("runs around Replay(state, 100ms)", gaps(starts["replay"]), 100*time.Millisecond)
	require.Len(t, starts["await"], 2)
	check("steps around Await(...).Timeout(150ms)", gaps(starts["await"]), 150*time.Millisecond)
	// Its deadline (600 ms) passed inside the 800 ms transaction: the next
	// step comes once it commits, not a timeout after the commit (a sweep
	// woken at the commit plus the timeout: about 1,400 ms after the first).
	// The right answer took up to 632 ms for a 400 ms transaction on a
	// loaded machine; with a 300 ms timeout the wrong one was ~700 ms, too
	// near to tell apart (and with 150 ms, ~560 ms).
	require.Len(t, starts["await-tx"], 2)
	gap := gaps(starts["await-tx"])[0]
	t.Logf("steps around a WithTx Await(...).Timeout(600ms) whose transaction took 800ms: %v apart", gap)
	require.GreaterOrEqual(t, gap, 800*time.Millisecond)
	require.Less(t, gap, 1200*time.Millisecond, "woken a timeout after the commit, not at the deadline")
}

// TestRowsVisibleBelowThePickFloorRun (docs/design.md §4): while a queue is
// busy its picks look at nothing eligible before their floor (the last
// short pick's now() less a second). Rows that become visible below it
// still run, within the floor check's bound: a row inserted by a
// transaction that stays open past the slack, rows another process
// inserted with a RunAt in the past, and (woken at once) this process's own
// insert with a RunAt in the past, and (woken at once) the next step of
// this process's WithTx outcome whose transaction lasted past the slack.
func TestRowsVisibleBelowThePickFloorRun(t *testing.T) {
	t.Parallel()
	var b *testBundle
	job := &gendurable.Job[orderArgs]{Name: "floor", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	var txEnded atomic.Int64 // unix nanos: when the slow WithTx callback returned
	bStarted := make(chan time.Time, 1)
	slow := &gendurable.Machine[orderArgs]{
		Name: "slowtx", Start: "a",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"a": func(_ context.Context, r *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				return r.Next("b", r.State).WithTx(func(context.Context, pgx.Tx) error {
					time.Sleep(1600 * time.Millisecond)
					txEnded.Store(time.Now().UnixNano())
					return nil
				}), nil
			},
			"b": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				bStarted <- time.Now()
				return gendurable.Done(nil), nil
			},
		},
	}
	cfg := fastConfig("", job, slow)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 4,
		BusyPollInterval: 25 * time.Millisecond, PollInterval: time.Second, MaxPollInterval: 5 * time.Second}}
	b = setup(t, cfg)
	b.start()
	ctx := context.Background()
	defer keepBusy(b, job)()

	const bound = 4 * time.Second // FloorCheck (1 s) + a check + a pick, on a loaded machine
	ran := func(what string, id int64, since time.Time) {
		t.Helper()
		b.waitStatus(id, "done", 10*time.Second)
		took := time.Since(since)
		t.Logf("%s: done %v after it became visible", what, took)
		require.Less(t, took, bound, what)
	}

	// An insert whose transaction commits 2.5 s after its now().
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := b.eng.InsertTx(ctx, tx, job.New(orderArgs{I: 1}))
	require.NoError(t, err)
	time.Sleep(2500 * time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	ran("a transaction open 2.5 s", res.ID, time.Now())

	// Another process's insert with a RunAt in the past.
	other, err := gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{job},
		Logger: testLogger(t)})
	require.NoError(t, err)
	res, err = other.Insert(ctx, job.New(orderArgs{I: 2}).With(gendurable.InsertOpts{RunAt: time.Now().Add(-time.Hour)}))
	require.NoError(t, err)
	ran("another process's RunAt an hour ago", res.ID, time.Now())

	// This process's own: it lowers the floor itself.
	start := time.Now()
	res, err = b.eng.Insert(ctx, job.New(orderArgs{I: 3}).With(gendurable.InsertOpts{RunAt: time.Now().Add(-time.Hour)}))
	require.NoError(t, err)
	b.waitStatus(res.ID, "done", 10*time.Second)
	t.Logf("this process's RunAt an hour ago: done %v after the insert", time.Since(start))
	require.Less(t, time.Since(start), 500*time.Millisecond, "a local insert below the floor wakes its pick")

	// This process's WithTx outcome, its transaction open 1.6 s: the next
	// step's row is eligible from the transaction's start. Five times, and
	// the median judged: a floor check (once a second) could find one such
	// row this soon by luck (the median of five, about 3 % of the time), and
	// one try can be slow on a loaded machine (CI saw 296 ms once; a quiet
	// run 2–7 ms).
	var took []time.Duration
	for i := range 5 {
		res, err = b.eng.Insert(ctx, slow.New(orderArgs{I: 4 + i}))
		require.NoError(t, err)
		select {
		case at := <-bStarted:
			took = append(took, at.Sub(time.Unix(0, txEnded.Load())))
			t.Logf("WithTx open 1.6 s: next step %v after the callback returned", took[len(took)-1])
		case <-time.After(15 * time.Second):
			t.Fatal("the step after the slow WithTx never ran")
		}
		b.waitStatus(res.ID, "done", 10*time.Second)
	}
	slices.Sort(took)
	require.Less(t, took[len(took)/2], 150*time.Millisecond, "a local WithTx outcome below the floor wakes its pick (median of %v)", took)
}

// TestStopWithAPickCutOff: the network is cut while the feeder's pick is in
// flight (its statement waits for a reply that never comes). Stop with a 1 s
// context returns by then, with ctx's error: it used to wait for the pick's
// own deadline, a lease (8 s here). Nothing is lost: the cut heals after Stop
// (the abandoned pick's bytes may then reach the server and claim rows for
// nobody), and another engine runs every job — rows claimed so are reaped
// once their lease ends.
func TestStopWithAPickCutOff(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "stoppick", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	b := setup(t, fastConfig("", job))
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval = 8*time.Second, 2*time.Second
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, PollInterval: 20 * time.Millisecond, MaxPollInterval: 20 * time.Millisecond}}
	eng, proxy := cutOffEngine(t, b, cfg)
	time.Sleep(200 * time.Millisecond) // the feeder polls: its connection is open and idle between picks
	proxy.Cut()
	ids := make([]int64, 10)
	for i := range ids {
		ids[i] = b.insert(job.New(orderArgs{}))
	}
	time.Sleep(300 * time.Millisecond) // the next pick is sent, and waits
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err := eng.Stop(ctx)
	took := time.Since(start)
	t.Logf("Stop took %s with a pick cut off: %v", took.Round(time.Millisecond), err)
	require.Less(t, took, 2500*time.Millisecond, "Stop waited for the pick cut off")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	proxy.Heal()
	require.NoError(t, b.eng.Start(context.Background()))
	defer func() { _ = b.eng.Stop(context.Background()) }()
	for _, id := range ids {
		b.waitStatus(id, "done", 30*time.Second)
	}
}

// TestRowsOfAPickWhoseAnswerIsLostCostNoAttempt (docs/design.md §4, "Claims
// no heartbeat confirmed"): a pick reaches the server and claims ten jobs of
// MaxAttempts 1, and its answer never comes back (the network is cut while
// the pick waits on the queue's GlobalConcurrency lock, which the test
// holds, and released once the cut is in place). Nobody works the ten
// claims; once their leases run out another engine's reaper returns them
// to runnable with no attempt charged, an uncharged lease_expired entry
// saying no heartbeat confirmed their steps, and they run to done on their
// first attempt. Before schema version 24 the reaper charged each its one
// attempt and all ten failed without having run.
func TestRowsOfAPickWhoseAnswerIsLostCostNoAttempt(t *testing.T) {
	t.Parallel()
	var ran atomic.Int32
	job := &gendurable.Job[orderArgs]{Name: "lostpick", Perform: func(context.Context, *gendurable.Run[orderArgs]) error {
		ran.Add(1)
		return nil
	}}
	b := setup(t, fastConfig("", job))
	ctx := context.Background()
	lock, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('gendurable:' || $1), hashtext('gendurable:queue:default'))`, b.schema)
	require.NoError(t, err)

	// The rows first: the pick that waits must have begun after them (a
	// pick claims rows eligible at its transaction's start).
	ps := make([]gendurable.InsertParams, 10)
	for i := range ps {
		ps[i] = job.New(orderArgs{I: i}).With(gendurable.InsertOpts{MaxAttempts: 1})
	}
	_, err = b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval = 2*time.Second, 500*time.Millisecond
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 10, GlobalConcurrency: 100,
		PollInterval: 20 * time.Millisecond, MaxPollInterval: 20 * time.Millisecond}}
	_, proxy := cutOffEngine(t, b, cfg)
	waiting := func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND query LIKE '%gendurable_pick%'
			  AND query LIKE '%' || $1 || '%' AND datname = current_database()`, b.schema) > 0
	}
	eventually(t, 10*time.Second, waiting, "the pick never waited on the queue's lock")
	proxy.Cut()
	require.NoError(t, lock.Commit(ctx))
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing' AND unstarted_token = -1`) == 10
	}, "the pick cut off did not claim the ten rows")

	require.NoError(t, b.eng.Start(ctx))
	defer func() { _ = b.eng.Stop(context.Background()) }()
	eventually(t, 30*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status IN ('done', 'failed')`) == 10
	}, "not every job finished")
	require.Equal(t, 10, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances
		WHERE status = 'done' AND attempt = 0 AND jsonb_array_length(errors) = 1
		  AND errors -> 0 @> '{"kind": "lease_expired", "uncharged": true}'
		  AND errors -> 0 ->> 'error' LIKE 'lease expired before any heartbeat confirmed the step started%'`),
		"the lost pick's rows ran on their first attempt")
	require.Equal(t, int32(10), ran.Load(), "each job ran once, in this engine")
}

// TestEngineMethodsHaveTheirDocComments: every exported method of Engine
// has a doc comment of its own (what go doc and pkg.go.dev show). Stop's
// lost its: a constant declared between the comment and the func took it
// over, and `go doc Engine.Stop` printed nothing.
func TestEngineMethodsHaveTheirDocComments(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	files, err := os.ReadDir(".")
	require.NoError(t, err)
	n := 0
	for _, f := range files {
		name := f.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || !fn.Name.IsExported() {
				continue
			}
			recv := fn.Recv.List[0].Type
			if star, ok := recv.(*ast.StarExpr); ok {
				recv = star.X
			}
			if id, ok := recv.(*ast.Ident); !ok || id.Name != "Engine" {
				continue
			}
			n++
			if fn.Doc == nil || !strings.HasPrefix(fn.Doc.Text(), fn.Name.Name+" ") {
				t.Errorf("%s: (*Engine).%s has no doc comment of its own", fset.Position(fn.Pos()), fn.Name.Name)
			}
		}
	}
	require.Greater(t, n, 10, "no Engine methods found")
}

// TestStopWithAContextAlreadyDoneOnAnIdleEngine: an engine with no step
// running, stopped with a context that is already done, has nothing to
// abandon: Stop returns nil and its drain is complete. It used to report
// "steps ignoring cancellation are still running" (and Completed false)
// every time: waiting for the running steps raced the done context, which
// always won.
func TestStopWithAContextAlreadyDoneOnAnIdleEngine(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "idle", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	log := &eventLog{}
	cfg := fastConfig("", job)
	cfg.Hooks = []gendurable.Hook{log}
	// One pick at start, then none for a minute: no pick is in flight at
	// Stop (one would be abandoned if it took 100 ms more, on a loaded
	// machine).
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, PollInterval: time.Minute, MaxPollInterval: time.Minute}}
	b := setup(t, cfg)
	picks := func() int {
		n := 0
		findEvent(log, func(*gendurable.PickEvent) bool { n++; return false })
		return n
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for round := range 5 {
		require.NoError(t, b.eng.Start(context.Background()))
		eventually(t, 5*time.Second, func() bool { return picks() > round }, "the feeder's first pick did not return")
		require.NoError(t, b.eng.Stop(done), "an idle engine's Stop abandoned nothing")
	}
	ev, ok := findEvent(log, func(*gendurable.DrainEvent) bool { return true })
	require.True(t, ok)
	require.True(t, ev.Completed, "an idle engine's drain is complete")
}

// TestReaperFailingAWokenInstanceConsumesItsInbox: an instance woken by a
// signal whose worker vanished mid-step, with no attempt left, is failed by
// the reaper. A failure consumes the inbox (as Stop and Cancel do): its
// signals are consumed and its inbox counts cleared together, so that a
// Retry finds the two agreeing. The reaper used to leave both, and Retry
// consumed the signals but kept the counts: the retried step saw no signal
// (Awaited empty) while the counts said one was there, so re-awaiting it
// woke the instance at once, for ever — a busy loop of steps, the signal
// never seen.
func TestReaperFailingAWokenInstanceConsumesItsInbox(t *testing.T) {
	t.Parallel()
	var woken, empty atomic.Int64
	m := &gendurable.Machine[waitState]{
		Name: "reapwake", Start: "park",
		Steps: map[string]gendurable.StepFunc[waitState]{
			"park": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				return r.Await("woken", r.State, "go"), nil
			},
			"woken": func(ctx context.Context, r *gendurable.Run[waitState]) (gendurable.Outcome, error) {
				woken.Add(1)
				if len(r.Awaited) == 0 {
					empty.Add(1)
					return r.Await("woken", r.State, "go"), nil
				}
				return gendurable.Done(len(r.Awaited)), nil
			},
		},
	}
	b := setup(t, nil, m)
	b.start()
	ctx := context.Background()
	res, err := b.eng.Insert(ctx, m.New(waitState{}).With(gendurable.InsertOpts{MaxAttempts: 1}))
	require.NoError(t, err)
	id := res.ID
	b.waitStatus(id, "awaiting_signal", 10*time.Second)
	require.NoError(t, b.eng.Pause(ctx, gendurable.DefaultQueue))
	_, err = b.eng.Signal(ctx, id, "go", nil, nil)
	require.NoError(t, err)
	// Woken and claimed by a worker that then vanished mid-step (a
	// heartbeat had confirmed the step: unstarted_token NULL): its lease
	// ran out.
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'executing', claim_token = 99, unstarted_token = NULL,
	        lease_expires_at = now() - interval '1 second' WHERE id = $1 AND status = 'runnable'`, id)
	// The engine's own reaper may take it first (a sweep due meanwhile, on a
	// loaded machine): the same statement, so either way is the case tested.
	n, err := b.eng.Reap(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, n, 1)
	b.waitStatus(id, "failed", time.Second)
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1 AND consumed_at IS NULL`, id),
		"the failed instance keeps an unconsumed signal")
	require.Equal(t, 0, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND inbox <> '{}'`, id),
		"the failed instance keeps its inbox counts")

	require.NoError(t, b.eng.Retry(ctx, id))
	require.NoError(t, b.eng.Resume(ctx, gendurable.DefaultQueue))
	b.waitStatus(id, "awaiting_signal", 10*time.Second)
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, "awaiting_signal", b.row(id).Status)
	require.LessOrEqual(t, woken.Load(), int64(1), "the retried step ran %d times (%d without a signal)", woken.Load(), empty.Load())
	_, err = b.eng.Signal(ctx, id, "go", nil, nil)
	require.NoError(t, err)
	r := b.waitStatus(id, "done", 10*time.Second)
	require.JSONEq(t, `1`, string(r.Result))
}

// stopFromHook calls Stop from a hook, with the hook's context, on the
// events named: once per event, its results sent on done.
type stopFromHook struct {
	eng  **gendurable.Engine
	on   func(gendurable.Event) bool
	done chan error
}

func (h *stopFromHook) OnEvent(ctx context.Context, ev gendurable.Event) {
	if h.on(ev) {
		h.done <- (*h.eng).Stop(ctx)
	}
}

// TestStopFromAHookDuringStopReturnsAtOnce: a hook that calls Stop while a
// Stop is in progress — on the DrainEvent the Stop emits, or on the
// StepEvent of a step the Stop is draining — gets nil at once, with the
// context the engine gave it: waiting for the Stop in progress, which waits
// for that hook, would wait for ever.
func TestStopFromAHookDuringStopReturnsAtOnce(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	job := &gendurable.Job[orderArgs]{Name: "hookstop", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
		started <- struct{}{}
		<-release
		return nil
	}}
	var eng *gendurable.Engine
	var stopping atomic.Bool
	hook := &stopFromHook{eng: &eng, done: make(chan error, 4), on: func(ev gendurable.Event) bool {
		switch ev.(type) {
		case *gendurable.DrainEvent:
			return true
		case *gendurable.StepEvent:
			return stopping.Load()
		}
		return false
	}}
	cfg := fastConfig("", job)
	cfg.Hooks = []gendurable.Hook{hook}
	cfg.DrainTimeout = 30 * time.Second
	b := setup(t, cfg)
	eng = b.eng
	b.insert(job.New(orderArgs{}))
	require.NoError(t, eng.Start(context.Background()))
	<-started
	stopped := make(chan error, 1)
	stopping.Store(true)
	go func() { stopped <- eng.Stop(context.Background()) }()
	time.Sleep(100 * time.Millisecond) // the Stop is draining the step
	close(release)                     // its StepEvent's hook calls Stop
	for _, what := range []string{"the StepEvent's", "the DrainEvent's"} {
		select {
		case err := <-hook.done:
			require.NoError(t, err, what)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s hook's Stop did not return", what)
		}
	}
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the Stop in progress did not return")
	}
}

// cutOffPool is a pool (of maxConns) that reaches the test server only
// through a dbtest.CutProxy, with pgx's defaults otherwise: no
// ConnectTimeout, no PingTimeout — a cut connection waits for its ctx.
func cutOffPool(t *testing.T, maxConns int32) (*pgxpool.Pool, *dbtest.CutProxy) {
	t.Helper()
	proxy := dbtest.NewCutProxyFor(t, dbtest.URL())
	pcfg := proxy.PoolConfig(t, dbtest.URL())
	pcfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		proxy.Close() // the pool's sockets end: nothing waits on the cut
		pool.Close()
	})
	return pool, proxy
}

// TestStopDuringAStartCutOff: Start waits on a network cut off (its first
// statement's connection gets no answer; its ctx allows 10 s). A Stop with
// a 300 ms context, called meanwhile, ends the start and returns within
// its ctx; Start returns an error wrapping ErrEngineStopped, and the engine
// is not running. Stop used to wait for the lock Start held across its
// round trips to the database, until Start's own ctx ended (10 s).
func TestStopDuringAStartCutOff(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "startcut", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	b := setup(t, fastConfig("", job))
	pool, proxy := cutOffPool(t, 2)
	cfg := fastConfig(b.schema, job)
	cfg.Logger = testLogger(t)
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	proxy.Cut()
	startErr := make(chan error, 1)
	startCtx, cancelStart := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelStart()
	go func() { startErr <- eng.Start(startCtx) }()
	time.Sleep(300 * time.Millisecond) // Start waits on the cut
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = eng.Stop(ctx)
	took := time.Since(start)
	t.Logf("Stop during a Start cut off took %s: %v", took.Round(time.Millisecond), err)
	require.NoError(t, err, "the start ended and nothing ran")
	require.Less(t, took, 2*time.Second, "Stop waited for the Start cut off")
	select {
	case err := <-startErr:
		t.Logf("Start: %v", err)
		require.ErrorIs(t, err, gendurable.ErrEngineStopped)
	case <-time.After(2 * time.Second):
		t.Fatal("Start went on after the Stop")
	}
	// The engine was not left running, and starts once the cut heals.
	proxy.Heal()
	require.NoError(t, eng.Start(context.Background()))
	b.waitStatus(b.insert(job.New(orderArgs{})), "done", 10*time.Second)
	require.NoError(t, eng.Stop(context.Background()))
}

// TestInsertDuringAStartCutOff: Start's first statement goes out on a
// connection cut off for good (dbtest.CutProxy.Strand: new connections go
// through) and waits for its ctx (8 s). An Insert with a 1 s context,
// meanwhile, commits on a fresh connection and returns within its ctx. It
// used to commit, then wait for the lock Start held across its round trips
// to wake the local feeders — until Start's ctx ended, long past its own.
func TestInsertDuringAStartCutOff(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "insertcut", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	b := setup(t, fastConfig("", job))
	pool, proxy := cutOffPool(t, 3)
	cfg := fastConfig(b.schema, job)
	cfg.Logger = testLogger(t)
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, pool.Ping(context.Background())) // one idle connection: Start takes it
	proxy.Strand()
	startErr := make(chan error, 1)
	startCtx, cancelStart := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancelStart()
	go func() { startErr <- eng.Start(startCtx) }()
	time.Sleep(300 * time.Millisecond) // Start waits on the stranded connection
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	res, err := eng.Insert(ctx, job.New(orderArgs{}))
	took := time.Since(start)
	t.Logf("Insert during a Start cut off took %s: %v", took.Round(time.Millisecond), err)
	require.NoError(t, err)
	require.Less(t, took, 2*time.Second, "Insert waited for the Start cut off")
	cancelStart()
	require.Error(t, <-startErr)
	b.start()
	b.waitStatus(res.ID, "done", 10*time.Second)
}

// TestStopWithAnOutcomeCutOff: a step returns while the network is cut
// off, so its outcome waits on the database (the committer retries it for
// up to a lease, 6 s here). Stop with a 1 s context gives the outcome up
// once its context and grace are over: the step's StepEvent (with the
// commit's error) is emitted before Stop returns, and Stop's error says
// that outcomes were abandoned. The row keeps its lease and runs again
// once it is reaped, and the engine started again writes outcomes again. The committer used to go on retrying after
// Stop returned — a goroutine and a pool connection of the stopped engine
// for up to a lease, its StepEvent reaching the hooks 6 s after the cut —
// and Stop blamed "steps ignoring cancellation".
func TestStopWithAnOutcomeCutOff(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	job := &gendurable.Job[orderArgs]{Name: "stopoutcome", Perform: func(context.Context, *gendurable.Run[orderArgs]) error {
		<-release
		return nil
	}}
	b := setup(t, fastConfig("", job))
	pool, proxy := cutOffPool(t, 3)
	cfg := fastConfig(b.schema, job)
	cfg.Logger = testLogger(t)
	cfg.LeaseDuration, cfg.HeartbeatInterval = 6*time.Second, 2*time.Second
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: -1, PollInterval: time.Minute, MaxPollInterval: time.Minute}}
	var stopped atomic.Bool
	var stepEvents, afterStop atomic.Int64
	cfg.Hooks = []gendurable.Hook{gendurable.HookFunc(func(_ context.Context, ev gendurable.Event) {
		if se, ok := ev.(*gendurable.StepEvent); ok {
			stepEvents.Add(1)
			if stopped.Load() {
				afterStop.Add(1)
				t.Logf("StepEvent after Stop returned: %+v", se)
			}
		}
	})}
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, eng.Start(context.Background()))
	res, err := eng.Insert(context.Background(), job.New(orderArgs{})) // kicks its feeder
	require.NoError(t, err)
	id := res.ID
	b.waitStatus(id, "executing", 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	proxy.Cut()
	close(release) // the step returns: its outcome waits on the cut
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err = eng.Stop(ctx)
	stopped.Store(true)
	took := time.Since(start)
	t.Logf("Stop took %s with an outcome cut off: %v", took.Round(time.Millisecond), err)
	require.Less(t, took, 2500*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "outcomes still waiting on the database were abandoned")
	require.Equal(t, int64(1), stepEvents.Load(), "the step's event, with its commit's error, before Stop returned")
	time.Sleep(6 * time.Second) // a lease: the committer's retries would have ended by now
	require.Zero(t, afterStop.Load(), "nothing of the stopped engine reached the hooks")

	// Started again once the cut heals, the same engine writes outcomes
	// again; the row, reaped after its lease, runs on another engine.
	proxy.Heal()
	stopped.Store(false)
	require.NoError(t, eng.Start(context.Background()))
	defer func() { _ = eng.Stop(context.Background()) }()
	res, err = eng.Insert(context.Background(), job.New(orderArgs{I: 1}))
	require.NoError(t, err)
	b.waitStatus(res.ID, "done", 15*time.Second)
	b.start()
	b.waitStatus(id, "done", 15*time.Second)
}

// TestInstanceTooLargeToClaimFailsAlone: a join whose children's results
// add up past 256 MB cannot be claimed — the pick builds the children it
// hands the step as one jsonb value, which PostgreSQL refuses (SQLSTATE
// 54000), and the whole pick fails. Before, the parent stayed runnable for
// good, with no error of its own, and every pick that reached it failed
// (each costing the server ~300 MB). Now such a pick makes the engine fail
// the rows at the head of the queue that are too large, with the sizes in
// their reason, and the queue goes on.
func TestInstanceTooLargeToClaimFailsAlone(t *testing.T) {
	t.Parallel()
	leaf := &gendurable.Job[orderArgs]{Name: "leaf", Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error { return nil }}
	parent := statusParent("par", func() []gendurable.InsertParams {
		var ks []gendurable.InsertParams
		for range 300 {
			ks = append(ks, leaf.New(orderArgs{}).With(gendurable.InsertOpts{RunIn: time.Hour}))
		}
		return ks
	})
	cfg := fastConfig("", parent, leaf)
	cfg.LeaseDuration, cfg.HeartbeatInterval = 30*time.Second, 5*time.Second
	b := setup(t, cfg)
	b.start()
	id := b.insert(parent.New(fanState{}))
	b.waitStatus(id, "awaiting_children", 10*time.Second)
	// Every child done with a 1 MB result (a string PostgreSQL compresses
	// on disk: 300 MB only once the pick builds its value).
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'done', finished_at = now(), result = to_jsonb(repeat('x', 1000000)) WHERE parent_id = $1`, id)
	b.exec(`UPDATE {{s}}.gendurable_instances SET status = 'runnable', children_pending = 0, eligible_at = now() WHERE id = $1`, id)
	after := b.insert(leaf.New(orderArgs{I: 1}))
	r := b.waitStatus(id, "failed", 90*time.Second)
	last := r.Errors[len(r.Errors)-1]
	require.Equal(t, "cancelled", last["kind"])
	require.Contains(t, last["error"], "too large to claim")
	require.Contains(t, last["error"], "256 MB")
	b.waitStatus(after, "done", 30*time.Second)

	// The same for an instance holding 300 unconsumed 1 MB signals.
	full := b.insert(leaf.New(orderArgs{I: 2}).With(gendurable.InsertOpts{RunIn: time.Hour}))
	b.exec(`INSERT INTO {{s}}.gendurable_signals (target_id, name, payload) SELECT $1, 'note', to_jsonb(repeat('y', 1000000)) FROM generate_series(1, 300)`, full)
	b.exec(`UPDATE {{s}}.gendurable_instances SET inbox = '{"note": 300}', eligible_at = now() WHERE id = $1`, full)
	r = b.waitStatus(full, "failed", 90*time.Second)
	require.Contains(t, r.Errors[len(r.Errors)-1]["error"], "its unconsumed signals to 300")
	require.Zero(t, b.count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE target_id = $1 AND consumed_at IS NULL`, full), "the failure consumed them")
}

// TestWithTxFailingAfterTheCallbackGoesToHandle: a WithTx transaction that
// the server refuses to commit (a deferred foreign key the callback broke),
// one the callback left aborted (it ignored a failed statement and returned
// nil), and a callback that committed the transaction itself. Each was
// taken for a lost connection and tried again for a whole lease, Handle
// never asked: the callback ran 27–28 times for 3 attempts, the instance
// failed with "lease expired with no outcome (worker crashed or stalled)"
// and the server's error only in the log — and the callback that committed
// by itself had its writes committed on every try (27 rows for one
// instance; a probe's figures). Now Handle gets the server's error once per
// attempt, nothing of the callback is committed, and Commit/Rollback on the
// engine's transaction return ErrTxOwned.
func TestWithTxFailingAfterTheCallbackGoesToHandle(t *testing.T) {
	t.Parallel()
	type st struct {
		Case string `json:"case"`
	}
	var mu sync.Mutex
	var schema string // set once setup made it
	calls := map[string]int{}
	handled := map[string][]error{}
	m := &gendurable.Machine[st]{
		Name: "txfail", Start: "pay", MaxAttempts: 2,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		Steps: map[string]gendurable.StepFunc[st]{
			"pay": func(_ context.Context, r *gendurable.Run[st]) (gendurable.Outcome, error) {
				c := r.State.Case
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					mu.Lock()
					calls[c]++
					mu.Unlock()
					switch c {
					case "deferred":
						_, err := tx.Exec(ctx, `INSERT INTO "`+schema+`".txfail_child (parent) VALUES (-1)`)
						return err
					case "swallowed":
						_, _ = tx.Exec(ctx, `SELECT 1/0`)
						return nil
					case "committed":
						if _, err := tx.Exec(ctx, `INSERT INTO "`+schema+`".txfail_effect (id) VALUES ($1)`, r.ID); err != nil {
							return err
						}
						if err := tx.Commit(ctx); !errors.Is(err, gendurable.ErrTxOwned) {
							return fmt.Errorf("Commit on the engine's transaction: %v", err)
						}
						if err := tx.Rollback(ctx); !errors.Is(err, gendurable.ErrTxOwned) {
							return fmt.Errorf("Rollback on the engine's transaction: %v", err)
						}
						return nil
					}
					return nil
				}), nil
			},
		},
		Handle: func(_ context.Context, r *gendurable.Run[st], err error) (gendurable.Outcome, error) {
			mu.Lock()
			handled[r.State.Case] = append(handled[r.State.Case], err)
			mu.Unlock()
			if r.Attempt+1 >= r.MaxAttempts {
				return gendurable.Stop(err.Error()), nil
			}
			return r.Replay(r.State, 10*time.Millisecond), nil
		},
	}
	b := setup(t, nil, m)
	schema = b.schema
	b.exec(`CREATE TABLE {{s}}.txfail_parent (id bigint PRIMARY KEY)`)
	b.exec(`CREATE TABLE {{s}}.txfail_child (parent bigint REFERENCES {{s}}.txfail_parent DEFERRABLE INITIALLY DEFERRED)`)
	b.exec(`CREATE TABLE {{s}}.txfail_effect (id bigint)`)
	b.start()
	ids := map[string]int64{}
	for _, c := range []string{"deferred", "swallowed", "committed"} {
		ids[c] = b.insert(m.New(st{Case: c}))
	}
	for c, want := range map[string]string{"deferred": "failed at COMMIT", "swallowed": "25P02"} {
		r := b.waitStatus(ids[c], "failed", 20*time.Second)
		require.NotEmpty(t, r.Errors)
		for _, e := range r.Errors {
			require.Contains(t, e["error"], want, c)
			require.NotEqual(t, "lease_expired", e["kind"], c)
		}
	}
	b.waitStatus(ids["committed"], "done", 20*time.Second)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM {{s}}.txfail_effect`), "the callback's write, committed once, with the outcome")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"deferred": 2, "swallowed": 2, "committed": 1}, calls, "one callback run per attempt")
	for _, c := range []string{"deferred", "swallowed"} {
		require.Len(t, handled[c], 2, c)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, handled[c][0], &pgErr, "Handle sees the server's error (%s)", c)
	}
	code := func(err error) string { var e *pgconn.PgError; errors.As(err, &e); return e.Code }
	require.Equal(t, "23503", code(handled["deferred"][0]), "the deferred foreign key")
	require.Equal(t, "22012", code(handled["swallowed"][0]), "the statement that failed first, not the abort it left")
}

// TestStopWithAWithTxOutcomeCutOff: the network is cut while a WithTx
// callback runs; the callback returns, and the engine's outcome statement
// in its transaction waits on the cut. Stop, out of time, gives up the
// outcomes still waiting on the database — the WithTx transaction's too:
// it no longer waits a lease after Stop (a probe: Stop said "steps ignoring
// cancellation are still running" though the callback had returned, and
// the process's pool.Close waited 75 s more).
func TestStopWithAWithTxOutcomeCutOff(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	m := &gendurable.Machine[orderArgs]{
		Name: "stopwithtx", Start: "pay",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					<-release
					return nil
				}), nil
			},
		},
	}
	b := setup(t, fastConfig("", m))
	pool, proxy := cutOffPool(t, 3)
	cfg := fastConfig(b.schema, m)
	cfg.Logger = testLogger(t)
	cfg.LeaseDuration, cfg.HeartbeatInterval = 20*time.Second, 5*time.Second
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: -1, PollInterval: time.Minute, MaxPollInterval: time.Minute}}
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, eng.Start(context.Background()))
	res, err := eng.Insert(context.Background(), m.New(orderArgs{}))
	require.NoError(t, err)
	b.waitStatus(res.ID, "executing", 10*time.Second)
	time.Sleep(300 * time.Millisecond) // the transaction has begun and asked for its backend
	proxy.Cut()
	close(release) // the callback returns: the outcome statement waits on the cut
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err = eng.Stop(ctx)
	took := time.Since(start)
	t.Logf("Stop took %s with a WithTx outcome cut off: %v", took.Round(time.Millisecond), err)
	require.Less(t, took, 3*time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "outcomes still waiting on the database were abandoned")
	require.NotContains(t, err.Error(), "ignoring cancellation", "the WithTx outcome was given up with the others")
	proxy.Heal()
}

// TestConfigIsACopy (an API probe): Engine.Config returned the engine's own
// Queues map and KeyPolicies slice, so editing a copy to derive another
// engine's configuration changed the running engine — unvalidated (a
// policy Limit 0 that New refuses; a queue left without its defaults, whose
// feeder then picked thousands of times a second). New also filled the
// queues' defaults into the caller's map. Both are copies now.
func TestConfigIsACopy(t *testing.T) {
	t.Parallel()
	job := &gendurable.Job[orderArgs]{Name: "cfgcopy", Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
	cfg := fastConfig("", job)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 2}}
	cfg.KeyPolicies = []gendurable.KeyPolicy{{Prefix: "k-", Limit: 2}}
	b := setup(t, cfg)
	require.Equal(t, gendurable.QueueConfig{Concurrency: 2}, cfg.Queues["default"], "New wrote into the caller's map")
	want := b.eng.Config()
	require.Positive(t, want.Queues["default"].PollInterval, "the engine's own copy has the defaults")

	c := b.eng.Config()
	c.Queues["default"] = gendurable.QueueConfig{Concurrency: 7}
	c.Queues["other"] = gendurable.QueueConfig{Concurrency: 1}
	c.KeyPolicies[0].Limit = 0
	c.Machines[0] = nil
	cfg.Queues["default"] = gendurable.QueueConfig{Concurrency: 9}
	cfg.KeyPolicies[0].Limit = 5
	require.Equal(t, want, b.eng.Config(), "editing a copy changed the engine")

	b.start()
	id := b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{PartitionKey: "k-1"}))
	b.waitStatus(id, "done", 10*time.Second)
	w, err := b.eng.WaitReason(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, gendurable.StatusDone, w.Status)
}

// TestStopFromAStepStopsTheEngineAndKeepsItsOutcome: a step that calls
// Stop with its own context, on a running engine with no Stop in progress,
// gets nil at once; the engine stops, and the step's outcome is written.
// Stop used to wait for the very step that called it: DrainTimeout and
// 500 ms, then it reported the step as ignoring cancellation and dropped
// its outcome, leaving the row executing until another process's reaper
// charged it an attempt.
func TestStopFromAStepStopsTheEngineAndKeepsItsOutcome(t *testing.T) {
	t.Parallel()
	var eng *gendurable.Engine
	type call struct {
		err  error
		took time.Duration
	}
	calls := make(chan call, 4)
	job := &gendurable.Job[orderArgs]{Name: "stopper", Perform: func(ctx context.Context, _ *gendurable.Run[orderArgs]) error {
		start := time.Now()
		err := eng.Stop(ctx)
		calls <- call{err, time.Since(start)}
		return nil
	}}
	cfg := fastConfig("", job)
	cfg.DrainTimeout = 5 * time.Second
	b := setup(t, cfg)
	eng = b.eng
	id := b.insert(job.New(orderArgs{}))
	require.NoError(t, eng.Start(context.Background()))
	select {
	case c := <-calls:
		require.NoError(t, c.err)
		require.Less(t, c.took, time.Second, "a Stop from a step returns at once")
	case <-time.After(10 * time.Second):
		t.Fatal("the step did not run")
	}
	// The run is the Stop's at once: a Start now waits for it to end, then
	// starts a new run, which nothing stops behind its back.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, eng.Start(ctx), "a Start while the step's Stop drains waits for it")
	r := b.waitStatus(id, "done", 10*time.Second)
	require.Equal(t, 0, r.Attempt, "the step's outcome was written, no attempt charged")
	require.Empty(t, r.Errors)
	id2 := b.insert(job.New(orderArgs{}))
	select {
	case c := <-calls: // the new run runs the step, which stops it in turn
		require.NoError(t, c.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the new run did not run the second instance")
	}
	b.waitStatus(id2, "done", 10*time.Second)
	require.NoError(t, eng.Stop(ctx))
	require.Len(t, calls, 0, "each step ran once")
}

// TestAStopFromAStepWithTheLongestDrainTimeoutDrains (a misuse probe): a
// DrainTimeout of a Duration's whole range means "as long as steps need".
// A Stop called from a step allows DrainTimeout and 5 s: the sum wrapped
// negative, and the Stop cancelled the other running step at once (its run
// interrupted, the row back to runnable) where the default let it finish.
func TestAStopFromAStepWithTheLongestDrainTimeoutDrains(t *testing.T) {
	t.Parallel()
	var eng *gendurable.Engine
	slowStarted := make(chan struct{}, 1)
	slow := &gendurable.Job[orderArgs]{Name: "slowdrain", Perform: func(ctx context.Context, _ *gendurable.Run[orderArgs]) error {
		slowStarted <- struct{}{}
		select {
		case <-time.After(700 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}}
	stopErr := make(chan error, 1)
	stopper := &gendurable.Job[orderArgs]{Name: "drainstopper", Perform: func(ctx context.Context, _ *gendurable.Run[orderArgs]) error {
		stopErr <- eng.Stop(ctx)
		return nil
	}}
	cfg := fastConfig("", slow, stopper)
	cfg.DrainTimeout = math.MaxInt64
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 2, PollInterval: 20 * time.Millisecond}}
	b := setup(t, cfg)
	eng = b.eng
	slowID := b.insert(slow.New(orderArgs{}))
	b.start()
	select {
	case <-slowStarted:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow step did not start")
	}
	stopID := b.insert(stopper.New(orderArgs{}))
	select {
	case err := <-stopErr:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the stopping step did not run")
	}
	r := b.waitStatus(slowID, "done", 10*time.Second)
	require.Equal(t, 0, r.Attempt, "the slow step finished, not interrupted")
	require.Empty(t, r.Errors)
	b.waitStatus(stopID, "done", 10*time.Second)
}

// TestStopAfterThePoolWasClosedSaysSo: the pool closed while steps run
// (a defer in the wrong order) — their outcomes cannot be written, nor
// the prefetched rows handed back. Stop used to return nil and log
// "drained"; its error now says how many outcomes the closed pool refused
// and that prefetched rows were not handed back, wrapping
// puddle.ErrClosedPool. The rows run again elsewhere once their leases
// expire.
func TestStopAfterThePoolWasClosedSaysSo(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	job := &gendurable.Job[orderArgs]{Name: "closedpool", Perform: func(context.Context, *gendurable.Run[orderArgs]) error {
		<-release
		return nil
	}}
	b := setup(t, fastConfig("", job))
	pool, _ := cutOffPool(t, 3)
	cfg := fastConfig(b.schema, job)
	cfg.Logger = testLogger(t)
	cfg.LeaseDuration, cfg.HeartbeatInterval = 2*time.Second, 500*time.Millisecond
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 2, Prefetch: 2}}
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	var ids []int64
	for i := range 4 {
		res, err := b.eng.Insert(context.Background(), job.New(orderArgs{I: i}))
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	require.NoError(t, eng.Start(context.Background()))
	require.Eventually(t, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`) == 4
	}, 10*time.Second, 10*time.Millisecond, "two running, two prefetched")
	// Marked not started by a heartbeat: a prefetched claim then starts
	// only once a statement has cleared its mark, which the closed pool
	// refuses. Unmarked (the pool closed within a heartbeat of the claims,
	// as a loaded CI run did), the two started when the running steps
	// ended, and four outcomes failed instead of two.
	require.Eventually(t, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE unstarted_token IS NOT NULL`) == 2
	}, 10*time.Second, 10*time.Millisecond, "the prefetched claims marked not started")
	pool.Close()
	close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = eng.Stop(ctx)
	t.Logf("Stop: %v", err)
	require.ErrorIs(t, err, puddle.ErrClosedPool)
	require.ErrorContains(t, err, "2 outcomes could not be written")
	require.ErrorContains(t, err, "handing back 2 prefetched rows failed")

	// Nothing was lost: another engine runs all four once the leases expire.
	b.start()
	for _, id := range ids {
		b.waitStatus(id, "done", 15*time.Second)
	}
}

// TestStopHandsBackPrefetchedRowsAfterItsSessionsWereTerminated: the
// engine's server sessions are terminated (a failover, an operator's
// pg_terminate_backend), then it is stopped at once. Handing the
// prefetched rows back used to be tried once, on a dead connection: it
// failed, Stop said so, and the rows waited out their lease. It is tried
// again on a fresh connection now: Stop returns nil and every row is
// runnable at once, no attempt counted.
func TestStopHandsBackPrefetchedRowsAfterItsSessionsWereTerminated(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	job := &gendurable.Job[orderArgs]{Name: "termstop", Perform: func(ctx context.Context, _ *gendurable.Run[orderArgs]) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}}
	b := setup(t, fastConfig("", job))
	app := "gd_termstop_" + b.schema
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	pcfg.MaxConns = 4
	pcfg.MinConns = 3 // idle sessions too, to be terminated with the rest
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := fastConfig(b.schema, job)
	cfg.Logger = testLogger(t)
	cfg.LeaseDuration, cfg.HeartbeatInterval = 30*time.Second, 10*time.Second
	cfg.DrainTimeout = 100 * time.Millisecond // the running step returns on its cancel
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: 4}}
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	for i := range 5 {
		b.insert(job.New(orderArgs{I: i}))
	}
	require.NoError(t, eng.Start(context.Background()))
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'executing'`) == 5
	}, "one running, four prefetched")
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app) >= 3
	}, "the pool's sessions")
	require.Positive(t, b.count(`SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) AS x`, app))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, eng.Stop(ctx))
	require.Equal(t, 4, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'runnable' AND attempt = 0`),
		"the prefetched rows are runnable at once (lease 30 s)")
}

// TestAStopEndsAStartWaitingItsTurn: a Start that waits for a Stop in
// progress, and a second Stop called meanwhile: once that Stop returned,
// the waiting Start does not start the engine (it returns an error wrapping
// ErrEngineStopped). Before, it started right after — a shutdown that went
// on to close its pool left a running engine on a closed pool (a probe: 50
// of 50 rounds with two racing Starts and a Stop).
func TestAStopEndsAStartWaitingItsTurn(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	b := startedOnADeafStep(t, release) // the first Stop drains until release
	ctx := context.Background()
	firstStop := make(chan error, 1)
	go func() { firstStop <- b.eng.Stop(ctx) }()
	eventually(t, 5*time.Second, func() bool {
		// The Stop is in progress once a Start has to wait for it.
		sctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		return errors.Is(b.eng.Start(sctx), context.DeadlineExceeded)
	}, "the first Stop never began")
	waiting := make(chan error, 1)
	go func() { waiting <- b.eng.Start(ctx) }()
	time.Sleep(100 * time.Millisecond) // the Start waits for the first Stop
	secondStop := make(chan error, 1)
	go func() { secondStop <- b.eng.Stop(ctx) }()
	time.Sleep(100 * time.Millisecond)
	close(release)
	require.NoError(t, <-firstStop)
	require.NoError(t, <-secondStop)
	require.ErrorIs(t, <-waiting, gendurable.ErrEngineStopped, "the Start begun before the second Stop")
	// Nothing is running: a new Start starts it.
	require.NoError(t, b.eng.Start(ctx))
	require.NoError(t, b.eng.Stop(ctx))
}

// startedOnADeafStep is a started engine (DrainTimeout 10 s) running one
// job step that ignores its context until release is closed.
func startedOnADeafStep(t *testing.T, release <-chan struct{}) *testBundle {
	t.Helper()
	started := make(chan struct{}, 1)
	job := &gendurable.Job[orderArgs]{Name: "deaf", Perform: func(context.Context, *gendurable.Run[orderArgs]) error {
		started <- struct{}{}
		<-release // ignores its context
		return nil
	}}
	cfg := fastConfig("", job)
	cfg.DrainTimeout = 10 * time.Second
	b := setup(t, cfg)
	b.insert(job.New(orderArgs{}))
	require.NoError(t, b.eng.Start(context.Background()))
	<-started
	return b
}

// TestAPrefetchedStepStartsOnALiveLease: a prefetched plain claim whose row
// another transaction holds locked past its lease (the heartbeat skips a
// locked row, and counts a plain one as extended) starts on a lease live on
// the database clock, not on the one that ran out meanwhile. A probe
// stopped the server process of the claim's own heartbeat inside its UPDATE
// for 6 s: the step started 4.7 s past its lease. Here a transaction of the
// test's holds the row (lease 1.2 s) until just after the running step ends,
// so the clear that gates the prefetched step comes before the next
// heartbeat (400 ms).
func TestAPrefetchedStepStartsOnALiveLease(t *testing.T) {
	t.Parallel()
	finishA, aDone := make(chan struct{}), make(chan struct{})
	var b *testBundle
	var bLive atomic.Int32 // 1: the prefetched step saw its lease live; 2: run out
	job := &gendurable.Job[orderArgs]{Name: "prefetched", Perform: func(ctx context.Context, r *gendurable.Run[orderArgs]) error {
		if r.State.I == 0 {
			<-finishA
			close(aDone)
			return nil
		}
		var live bool
		if err := b.pool.QueryRow(context.Background(), replaceSchema(`SELECT lease_expires_at > clock_timestamp()
			FROM {{s}}.gendurable_instances WHERE id = $1 AND claim_token = $2`, b.schema), r.ID, r.Token).Scan(&live); err != nil {
			return err
		}
		if live {
			bLive.Store(1)
		} else {
			bLive.Store(2)
		}
		return nil
	}}
	cfg := fastConfig("", job)
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = 1200*time.Millisecond, 400*time.Millisecond, -1
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: 1, Prefetch: 1,
		PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond}}
	b = setup(t, cfg)
	a := b.insert(job.New(orderArgs{I: 0}))
	pre := b.insert(job.New(orderArgs{I: 1}))
	b.start()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(finishA) }) })
	eventually(t, 10*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE id = $1 AND unstarted_token IS NOT NULL`, pre) == 1
	}, "the prefetched claim marked not started by a heartbeat")
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, replaceSchema(`SELECT 1 FROM {{s}}.gendurable_instances WHERE id = $1 FOR UPDATE`, b.schema), pre)
	require.NoError(t, err)
	time.Sleep(1400 * time.Millisecond) // past the prefetched claim's lease on the database clock
	var expired bool
	require.NoError(t, b.pool.QueryRow(ctx, replaceSchema(`SELECT lease_expires_at < clock_timestamp()
		FROM {{s}}.gendurable_instances WHERE id = $1`, b.schema), pre).Scan(&expired))
	require.True(t, expired, "the locked row's lease ran out")
	once.Do(func() { close(finishA) })
	<-aDone
	time.Sleep(50 * time.Millisecond) // the clear that gates its start is being tried again
	require.NoError(t, tx.Commit(ctx))
	b.waitStatus(a, "done", 10*time.Second)
	b.waitStatus(pre, "done", 10*time.Second)
	require.Equal(t, int32(1), bLive.Load(), "the prefetched step started on a lease that had run out")
}

// TestAnEngineNotMadeByNewFailsTyped: every method of a nil *Engine and of
// a zero Engine{} returns ErrNotMade (and so ErrInvalidConfig) instead of
// panicking on a nil field or blaming the schema name ("invalid schema
// name: """). It calls the methods by reflection, so a method added later
// is checked too.
func TestAnEngineNotMadeByNewFailsTyped(t *testing.T) {
	t.Parallel()
	errType := reflect.TypeFor[error]()
	for name, e := range map[string]*gendurable.Engine{"nil": nil, "zero": {}} {
		v := reflect.ValueOf(e)
		for i := range v.NumMethod() {
			m, mt := v.Method(i), v.Type().Method(i)
			args := make([]reflect.Value, m.Type().NumIn())
			for j := range args {
				in := m.Type().In(j)
				if in == reflect.TypeFor[context.Context]() {
					args[j] = reflect.ValueOf(context.Background())
				} else {
					args[j] = reflect.Zero(in)
				}
			}
			var out []reflect.Value
			require.NotPanics(t, func() { out = m.Call(args) }, "%s Engine: %s", name, mt.Name)
			if n := len(out); n > 0 && out[n-1].Type() == errType {
				err, _ := out[n-1].Interface().(error)
				require.ErrorIs(t, err, gendurable.ErrNotMade, "%s Engine: %s", name, mt.Name)
				require.ErrorIs(t, err, gendurable.ErrInvalidConfig, "%s Engine: %s", name, mt.Name)
			}
		}
	}
	_, err := gendurable.WaitResult[int](context.Background(), nil, 1)
	require.ErrorIs(t, err, gendurable.ErrNotMade)
}

// TestTheLastSaturationEventAfterStopSaysTheFeederIsEmpty: the last
// SaturationEvent of a stopped engine's queue reports no step running and
// no row buffered. It came only after picks, so the last one was a pick's
// from before the Stop (2 running, 2 buffered here), and a gauge fed from
// it (gdotel's gendurable.scheduler.in_flight and .buffered) kept reporting
// that load in a stopped engine (an observability probe).
func TestTheLastSaturationEventAfterStopSaysTheFeederIsEmpty(t *testing.T) {
	job := &gendurable.Job[orderArgs]{
		Name: "saturation_after_stop",
		Perform: func(ctx context.Context, j *gendurable.Run[orderArgs]) error {
			<-ctx.Done()
			return ctx.Err()
		},
	}
	log := &eventLog{}
	cfg := &gendurable.Config{
		Machines:      []gendurable.Definition{job},
		Hooks:         []gendurable.Hook{log},
		LeaseDuration: 10 * time.Second, HeartbeatInterval: time.Second, DrainTimeout: 200 * time.Millisecond,
		Queues: map[string]gendurable.QueueConfig{"default": {Concurrency: 2, Prefetch: 2, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond}},
	}
	b := setup(t, cfg)
	ctx := context.Background()
	var ps []gendurable.InsertParams
	for i := 0; i < 6; i++ {
		ps = append(ps, job.New(orderArgs{I: i}))
	}
	_, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	require.NoError(t, b.eng.Start(ctx))
	eventually(t, 5*time.Second, func() bool {
		_, ok := findEvent(log, func(e *gendurable.SaturationEvent) bool { return e.InFlight == 2 && e.Buffered == 2 })
		return ok
	}, "the feeder never ran 2 steps with 2 rows buffered")
	require.NoError(t, b.eng.Stop(ctx))

	log.mu.Lock()
	var last *gendurable.SaturationEvent
	for _, ev := range log.events {
		if e, ok := ev.(*gendurable.SaturationEvent); ok && e.Queue == "default" {
			last = e
		}
	}
	log.mu.Unlock()
	require.NotNil(t, last)
	require.Equal(t, 0, last.InFlight, "steps running after Stop")
	require.Equal(t, 0, last.Buffered, "rows buffered after Stop")
	require.Equal(t, 2, last.Concurrency)
	require.Equal(t, 2, last.Prefetch)
	require.Equal(t, 6, b.count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'runnable'`))
}
