package gendurable_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// -gendurable.soak runs the stress tests at soak size (minutes, not seconds).
var soak = flag.Bool("gendurable.soak", false, "run the stress tests at soak size")

// The stress tests share the test server with every other test and other
// clients: every pool of theirs, in this process and in each of the two
// worker processes they run at a time, holds at most stressConns
// connections, all reserved from dbtest's budget (Options.Extra for the
// workers). At 20 per pool, and both tests at once, they used up to 92 of
// the server's 100 connections.
const stressConns = 8

var stressOpts = &dbtest.Options{MaxConns: stressConns, Extra: 2 * stressConns}

// stressMachines are what the stress worker processes run. The partitioned
// job records each step's start and end (database clock) in a spans table.
func stressMachines(pool *pgxpool.Pool, schema string) []gendurable.Definition {
	partitioned := &gendurable.Job[spanArgs]{
		Name: "span",
		Perform: func(ctx context.Context, j *gendurable.Run[spanArgs]) error {
			var started time.Time
			if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&started); err != nil {
				return err
			}
			time.Sleep(time.Duration(2+rand.IntN(8)) * time.Millisecond)
			_, err := pool.Exec(ctx, `INSERT INTO `+schema+`.spans (key, instance, attempt, started, ended)
				VALUES ($1, $2, $3, $4, clock_timestamp())`, j.State.Key, j.ID, j.Attempt, started)
			return err
		},
	}
	return []gendurable.Definition{awaiter(0), partitioned}
}

// TestHelperStressProcess is not a test: it is a worker (and signal sender)
// process the stress tests start, and sometimes kill.
func TestHelperStressProcess(t *testing.T) {
	schema := os.Getenv("GENDURABLE_STRESS_SCHEMA")
	if schema == "" {
		t.Skip("helper process only")
	}
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	if err != nil {
		os.Exit(3)
	}
	pcfg.MaxConns = stressConns
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		os.Exit(3)
	}
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema: schema, Machines: stressMachines(pool, schema),
		Queues:        map[string]gendurable.QueueConfig{"default": {Concurrency: stressConns - 2, PollInterval: 20 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond}},
		LeaseDuration: 2 * time.Second, HeartbeatInterval: 500 * time.Millisecond, ReaperInterval: 500 * time.Millisecond,
	})
	if err != nil {
		os.Exit(4)
	}
	if err := eng.Start(ctx); err != nil {
		os.Exit(5)
	}
	// Optionally send one "pay" signal to each instance id in [from, to).
	if from, _ := strconv.ParseInt(os.Getenv("GENDURABLE_STRESS_SIGNAL_FROM"), 10, 64); from > 0 {
		to, _ := strconv.ParseInt(os.Getenv("GENDURABLE_STRESS_SIGNAL_TO"), 10, 64)
		for id := from; id < to; id++ {
			if _, err := eng.Signal(ctx, id, "pay", id, nil); err != nil {
				fmt.Fprintln(os.Stderr, "signal:", err)
				os.Exit(6)
			}
		}
	}
	select {} // until killed
}

type stressProc struct {
	cmd *exec.Cmd
}

func startStressProc(t *testing.T, schema string, env ...string) *stressProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStressProcess$")
	cmd.Env = append(append(os.Environ(), "GENDURABLE_STRESS_SCHEMA="+schema), env...)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	p := &stressProc{cmd: cmd}
	t.Cleanup(p.kill)
	return p
}

func (p *stressProc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_, _ = p.cmd.Process.Wait()
	}
}

// TestStressNoLostWakeUpAcrossProcesses: thousands of instances await a
// signal while two worker processes and this one run them; signals come
// from many goroutines here and from the two other processes, before,
// during and after the parks. Afterwards no instance is parked with a
// matching unconsumed signal and every signal was consumed exactly once.
func TestStressNoLostWakeUpAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("stress")
	}
	t.Parallel()
	n := 2000
	if *soak {
		n = 50000
	}
	m := awaiter(0)
	pool, schema := dbtest.NewSchema(t, stressOpts)
	cfg := fastConfig(schema, m)
	cfg.Logger = testLogger(t)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: stressConns - 2, PollInterval: 20 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond}}
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	ctx := context.Background()
	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		ps[i] = m.New(waitState{})
	}
	res, err := eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	first, last := res[0].ID, res[n-1].ID
	quarter := (last - first + 1) / 4

	// The first quarter is signalled before anything runs.
	for id := first; id < first+quarter; id++ {
		_, err := eng.Signal(ctx, id, "pay", id, nil)
		require.NoError(t, err)
	}
	require.NoError(t, eng.Start(ctx))
	defer func() { _ = eng.Stop(ctx) }()
	// Two other processes work the queue and signal the second and third quarters.
	startStressProc(t, schema, fmt.Sprintf("GENDURABLE_STRESS_SIGNAL_FROM=%d", first+quarter), fmt.Sprintf("GENDURABLE_STRESS_SIGNAL_TO=%d", first+2*quarter))
	startStressProc(t, schema, fmt.Sprintf("GENDURABLE_STRESS_SIGNAL_FROM=%d", first+2*quarter), fmt.Sprintf("GENDURABLE_STRESS_SIGNAL_TO=%d", first+3*quarter))
	// Many goroutines here signal the last quarter while parks happen.
	var wg sync.WaitGroup
	for g := int64(0); g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := first + 3*quarter + g; id <= last; id += 8 {
				_, err := eng.Signal(ctx, id, "pay", id, nil)
				require.NoError(t, err)
			}
		}()
	}
	wg.Wait()

	count := func(sql string) int {
		var c int
		require.NoError(t, pool.QueryRow(ctx, replaceSchema(sql, schema)).Scan(&c))
		return c
	}
	deadline := time.Now().Add(120 * time.Second)
	for count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`) < n {
		lost := count(`SELECT count(*) FROM {{s}}.gendurable_instances i WHERE i.status = 'awaiting_signal'
			AND EXISTS (SELECT 1 FROM {{s}}.gendurable_signals s WHERE s.target_id = i.id AND s.consumed_at IS NULL AND s.name = ANY (i.awaits))`)
		if time.Now().After(deadline) {
			t.Fatalf("not finished: %d parked with a matching unconsumed signal (lost wake-ups)", lost)
		}
		time.Sleep(100 * time.Millisecond)
	}
	parkedWithSignal := count(`SELECT count(*) FROM {{s}}.gendurable_instances i WHERE i.status = 'awaiting_signal'
		AND EXISTS (SELECT 1 FROM {{s}}.gendurable_signals s WHERE s.target_id = i.id AND s.consumed_at IS NULL)`)
	consumed := count(`SELECT count(*) FROM {{s}}.gendurable_signals WHERE consumed_at IS NOT NULL`)
	exactlyOnce := count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE result->'got' = '["pay"]'`)
	t.Logf("stress lost-wakeup: %d instances, %d signals from 3 processes, %d parked with a matching signal, %d consumed, %d received exactly once",
		n, n, parkedWithSignal, consumed, exactlyOnce)
	require.Zero(t, parkedWithSignal)
	require.Equal(t, n, consumed)
	require.Equal(t, n, exactlyOnce)
}

// TestStressPartitionNoOverlapAcrossProcessesWithKills: steps of instances
// sharing a partition key never overlap in time (database clock), across
// three processes, while one worker is SIGKILLed and restarted repeatedly.
func TestStressPartitionNoOverlapAcrossProcessesWithKills(t *testing.T) {
	if testing.Short() {
		t.Skip("stress")
	}
	t.Parallel()
	n, keys, kills := 1500, 30, 3
	if *soak {
		n, keys, kills = 30000, 200, 30
	}
	pool, schema := dbtest.NewSchema(t, stressOpts)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.spans (key text, instance bigint, attempt int, started timestamptz, ended timestamptz)`)
	require.NoError(t, err)
	defs := stressMachines(pool, schema)
	job := defs[1].(*gendurable.Job[spanArgs])
	cfg := fastConfig(schema, defs...)
	cfg.Logger = testLogger(t)
	cfg.Queues = map[string]gendurable.QueueConfig{"default": {Concurrency: stressConns - 2, PollInterval: 20 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond}}
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReaperInterval = 2*time.Second, 500*time.Millisecond, 500*time.Millisecond
	eng, err := gendurable.New(pool, cfg)
	require.NoError(t, err)
	ps := make([]gendurable.InsertParams, n)
	for i := range ps {
		ps[i] = job.New(spanArgs{Key: fmt.Sprintf("k%d", i%keys)}).With(gendurable.InsertOpts{PartitionKey: fmt.Sprintf("k%d", i%keys)})
	}
	_, err = eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	require.NoError(t, eng.Start(ctx))
	defer func() { _ = eng.Stop(ctx) }()
	startStressProc(t, schema)
	victim := startStressProc(t, schema)
	for k := 0; k < kills; k++ {
		time.Sleep(700 * time.Millisecond)
		victim.kill()
		victim = startStressProc(t, schema)
	}

	count := func(sql string) int {
		var c int
		require.NoError(t, pool.QueryRow(ctx, replaceSchema(sql, schema)).Scan(&c))
		return c
	}
	deadline := time.Now().Add(40 * time.Second)
	for count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`) < n {
		if time.Now().After(deadline) {
			rows, _ := pool.Query(ctx, replaceSchema(`SELECT status::text, attempt, count(*), min(eligible_at - now()), max(errors::text) FROM {{s}}.gendurable_instances GROUP BY 1, 2`, schema))
			for rows.Next() {
				var st, e string
				var a, c int
				var d time.Duration
				_ = rows.Scan(&st, &a, &c, &d, &e)
				t.Logf("status %s attempt %d: %d rows, eligible in %s, errors %.300s", st, a, c, d, e)
			}
			rows.Close()
			t.Fatalf("not finished: %d of %d done", count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status = 'done'`), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	overlaps := count(`SELECT count(*) FROM {{s}}.spans a JOIN {{s}}.spans b
		ON a.key = b.key AND (a.instance, a.attempt, a.started) < (b.instance, b.attempt, b.started)
		AND a.started < b.ended AND b.started < a.ended`)
	spans := count(`SELECT count(*) FROM {{s}}.spans`)
	reruns := spans - n
	parallel := count(`SELECT count(*) FROM {{s}}.spans a JOIN {{s}}.spans b
		ON a.key <> b.key AND a.started < b.ended AND b.started < a.ended`)
	t.Logf("stress partition: %d instances over %d keys, 3 processes, %d kills: %d step spans, %d overlaps per key, %d reruns, %d cross-key overlaps (parallelism)",
		n, keys, kills, spans, overlaps, reruns, parallel)
	require.Zero(t, overlaps, "no two steps of one key ever overlapped")
	require.Positive(t, parallel, "different keys still ran in parallel")
	require.Zero(t, count(`SELECT count(*) FROM {{s}}.gendurable_instances WHERE status <> 'done'`))
}
