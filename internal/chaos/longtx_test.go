//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos"
	"github.com/jackc/pgx/v5"
)

// TestChaos10LongTransaction: while a worker processes a steady stream,
// another session opens a transaction, takes a transaction id (holding back
// the xmin horizon, so nothing it could see is vacuumed), sends a signal
// with SignalTx to an instance that is executing (locking its row) and then
// sits idle in transaction (3.5 s here, a minute at full size). The engine
// must keep committing work throughout, get its pick latency back once the
// transaction ends, and never itself hold a transaction open across user
// code.
func TestChaos10LongTransaction(t *testing.T) {
	ctx := bg(t, 10*time.Minute)
	env := newEnv(t, chaos.DefaultURL(), "longtx")
	fleet := newFleet(t)
	baseline, hold, after := pick(1500*time.Millisecond, 10*time.Second), pick(3500*time.Millisecond, 60*time.Second), pick(3*time.Second, 15*time.Second)
	cfg := env.Worker("w1")
	cfg.Concurrency, cfg.ReportPicks = 8, true
	proc, err := fleet.Start(cfg, 30*time.Second)
	must(t, err)
	app := chaos.AppName(env.Schema, "w1")

	feedCtx, stopFeed := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the steady stream: some 50 steps a second
		defer wg.Done()
		for feedCtx.Err() == nil {
			var ps []gendurable.InsertParams
			for i := 0; i < 2; i++ {
				ps = append(ps, env.M.Flow.New(chaos.FlowState{SleepMs: 150}), env.M.Plain.New(chaos.LeafState{SleepMs: 150}))
			}
			_, _ = env.Insert(feedCtx, "stream", ps)
			select {
			case <-feedCtx.Done():
			case <-time.After(150 * time.Millisecond):
			}
		}
	}()
	// The engine's own transactions: sample its sessions idle in a
	// transaction older than 100 ms (steps work 1-150 ms outside any).
	var idleTx, idleSamples atomic.Int64
	var maxIdleAge atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for feedCtx.Err() == nil {
			var n int64
			var age time.Duration
			if env.Admin.QueryRow(feedCtx, `SELECT count(*), coalesce(max(now() - xact_start), interval '0') FROM pg_stat_activity
				WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, app).Scan(&n, &age) == nil {
				idleSamples.Add(1)
				if age > 100*time.Millisecond {
					idleTx.Add(1)
				}
				if age.Microseconds() > maxIdleAge.Load() {
					maxIdleAge.Store(age.Microseconds())
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	time.Sleep(baseline)
	// The long transaction elsewhere.
	ccfg, err := pgx.ParseConfig(env.URL)
	must(t, err)
	ccfg.RuntimeParams["application_name"] = chaos.AppName(env.Schema, "longtx")
	conn, err := pgx.ConnectConfig(ctx, ccfg)
	must(t, err)
	defer conn.Close(context.Background())
	holdStart, err := env.Now(ctx)
	must(t, err)
	localHoldStart := time.Now()
	tx, err := conn.Begin(ctx)
	must(t, err)
	var xid int64
	must(t, tx.QueryRow(ctx, "SELECT txid_current()").Scan(&xid))
	var locked int64
	for deadline := time.Now().Add(3 * time.Second); locked == 0 && time.Now().Before(deadline); {
		var id int64
		if err := env.Admin.QueryRow(ctx, chaos.SQL(env.Schema, `SELECT id FROM {{s}}.gendurable_instances
			WHERE status = 'executing' AND fsm = 'plain' ORDER BY id DESC LIMIT 1`)).Scan(&id); err == nil {
			if _, err := env.Eng.SignalTx(ctx, tx, id, "poke", nil, nil); err == nil {
				locked = id
			}
		}
		if locked == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(hold - time.Since(localHoldStart))
	must(t, tx.Rollback(ctx))
	holdEnd, err := env.Now(ctx)
	must(t, err)
	localHoldEnd := time.Now()
	time.Sleep(after)
	localEnd := time.Now()
	stopFeed()
	wg.Wait()
	_, live, err := env.WaitTerminal(ctx, time.Now().Add(60*time.Second))
	must(t, err)
	_, stopErr := fleet.TermAll(30 * time.Second)
	r, err := env.Check(ctx, chaos.CheckOpts{})
	must(t, err)

	// Work committed in each second of the long transaction.
	rows, err := env.Admin.Query(ctx, chaos.SQL(env.Schema, `SELECT s, (SELECT count(*) FROM {{s}}.chaos_oracle
		WHERE ended >= $1 + s * interval '1 second' AND ended < $1 + (s + 1) * interval '1 second')
		FROM generate_series(0, floor(extract(epoch FROM $2::timestamptz - $1::timestamptz))::int - 1) AS s`), holdStart, holdEnd)
	must(t, err)
	var perSecond []int
	for rows.Next() {
		var s, n int
		must(t, rows.Scan(&s, &n))
		perSecond = append(perSecond, n)
	}
	rows.Close()
	baseRate, err := env.Count(ctx, `SELECT count(*) FROM {{s}}.chaos_oracle WHERE ended < $1 AND ended >= $1 - interval '2 seconds'`, holdStart)
	must(t, err)
	minSec := -1
	for _, n := range perSecond {
		if minSec < 0 || n < minSec {
			minSec = n
		}
	}

	// Pick latency: the median of the 250 ms windows' p99, per phase.
	p99 := func(from, to time.Time) (time.Duration, int) {
		var xs []int64
		for _, ev := range proc.Events("picks") {
			at := time.UnixMilli(ev.T)
			if at.After(from) && !at.After(to) {
				xs = append(xs, ev.P99)
			}
		}
		if len(xs) == 0 {
			return 0, 0
		}
		sort.Slice(xs, func(i, j int) bool { return xs[i] < xs[j] })
		return time.Duration(xs[len(xs)/2]) * time.Microsecond, len(xs)
	}
	base, nb := p99(localHoldStart.Add(-baseline), localHoldStart)
	during, nd := p99(localHoldStart, localHoldEnd)
	recovered, nr := p99(localEnd.Add(-2*time.Second), localEnd)

	c := &criteria{t: t}
	c.report(r.Violations(false))
	c.check(live == 0, "%d instances still live", live)
	c.check(locked != 0, "the long transaction found no executing instance to lock")
	c.check(len(perSecond) > 0 && minSec > 0, "a second of the long transaction passed with no step committed (per second: %v)", perSecond)
	c.check(nb > 0 && nr > 0, "no pick latency measured (%d baseline, %d after)", nb, nr)
	// Twice the latency before, with 10 ms of slack for a noisy machine:
	// a pick that does not recover wades through dead rows for far longer.
	limit := max(2*base, base+10*time.Millisecond)
	c.check(recovered <= limit, "pick latency did not recover: p99 %s after the transaction ended, %s before it (limit %s)", recovered, base, limit)
	c.check(idleTx.Load() == 0, "the engine held a transaction open for over 100 ms (%d of %d samples; longest %s): across user code?",
		idleTx.Load(), idleSamples.Load(), time.Duration(maxIdleAge.Load())*time.Microsecond)
	c.check(stopErr == nil, "graceful stop: %v", stopErr)
	summary(t, r.Line("long-tx", fmt.Sprintf("another session idle in transaction for %s (xid held, row of executing #%d locked)", hold, locked))+
		fmt.Sprintf(" (commits per second: %d in the 2 s before, %v during; pick p99 %s before, %s during, %s after; engine sessions idle in transaction > 100 ms: %d of %d samples, longest %s; %s)",
			baseRate/2, perSecond, base.Round(10*time.Microsecond), during.Round(10*time.Microsecond), recovered.Round(10*time.Microsecond),
			idleTx.Load(), idleSamples.Load(), (time.Duration(maxIdleAge.Load())*time.Microsecond).Round(time.Millisecond), r.Invariants()))
	_ = nd
	c.done()
}
