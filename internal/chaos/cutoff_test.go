//go:build chaos

package chaos_test

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/chaos"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
)

// TestChaos16CutOff: a worker process is cut off from the database while it
// runs keyed steps — a network partition, made by a proxy the harness runs
// between the worker's engine and the server: from one moment on no byte
// crosses in either direction, yet no socket is closed, so neither side is
// told. Unlike a stall (scenario 12) the process keeps running on its own
// clock. Three workers run keyed leaves (limit 1, 12 keys) that write their
// key's fenced resource when their work starts and ends. Half honour their
// context and work 1.75 leases (heartbeated); half ignore it and work
// briefly; then each, in its WithTx outcome, updates its key's application
// row and holds the transaction idle for 800 ms, so the
// cut finds transactions open, their sessions holding the key's row lock on
// a server that cannot know the client is gone. The harness's own records
// (side effects, the fenced resource) go around the proxy.
//
// Pass: among runs that honour their context, 0 overlapping runs of one
// key (database clock) — the cut worker's runs are cancelled with
// ErrLeaseLost by its own lease deadline, before the lease runs out on the
// database clock and another worker takes the key; the cut worker's
// transactions left open are ended by the server within a lease
// (idle_in_transaction_session_timeout, docs/design.md §2) instead of
// holding their locks for the OS keepalive's hours; every instance ends
// within lease + lease + reaper + 60 s of the cut; at the fenced resource,
// 0 stale writes accepted after a write of a newer claim of their key (a
// careless step of the cut worker, still running, may write before its
// key's next run does: the fence sees only the writes that reach it,
// RELIABILITY.md — counted apart); the cut worker's Engine.Stop returns
// within its context after SIGTERM; the usual invariants.
func TestChaos16CutOff(t *testing.T) {
	ctx := bg(t, 10*time.Minute)
	env := newEnv(t, chaos.DefaultURL(), "cutoff")
	fleet := newFleet(t)
	const keys, conc = 12, 4
	n := pick(96, 480)

	pcfg, err := pgx.ParseConfig(chaos.DefaultURL())
	must(t, err)
	proxy := dbtest.NewCutProxyFor(t, chaos.DefaultURL())
	engineURL := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pcfg.User, proxy.Addr(), pcfg.Database)

	var cut *chaos.Proc
	var lease, heartbeat time.Duration
	var stopBound time.Duration
	for i := 1; i <= 3; i++ {
		cfg := env.Worker(fmt.Sprintf("w%d", i))
		cfg.Concurrency, cfg.MaxConns = conc, 6 // 3 × 6 + w1's harness pool of 4 + the harness's 6
		// No prefetch: a buffered keyed row holds its key, and with the key
		// hand-off two workers could keep all 12 keys, the cut one none.
		cfg.Prefetch = -1
		if i == 1 {
			cfg.EngineURL = engineURL
			cfg.StopMs = 5000
			stopBound = time.Duration(cfg.StopMs) * time.Millisecond
		}
		p, err := fleet.Start(cfg, 30*time.Second)
		must(t, err)
		if i == 1 {
			cut = p
		}
		lease = time.Duration(cfg.LeaseMs) * time.Millisecond
		heartbeat = time.Duration(cfg.HeartbeatMs) * time.Millisecond
	}
	engineApp := chaos.AppName(env.Schema, "w1")

	ps := make([]gendurable.InsertParams, n)
	long := func(i int) bool { return (i/keys)%2 == 0 } // the rows that honour their context
	for i := range ps {
		// The rows that honour their context work 1.75 leases, heartbeated:
		// the cut worker's own lease deadline must stop them. The others
		// work briefly. Each then holds its outcome's transaction open.
		s := chaos.LeafState{SleepMs: 300, Fence: true, IgnoreCtx: (i/keys)%2 == 1, TxHoldMs: 800}
		if long(i) {
			// 1.75 leases and up to 1.1 s more, by key: the keys' cycles
			// drift apart, so a worker's keys are not all at work at once.
			s.SleepMs, s.Exact = int(lease/time.Millisecond)*7/4+(i%keys)*100, true
		}
		ps[i] = env.M.Leaf.New(s).With(gendurable.InsertOpts{PartitionKey: fmt.Sprintf("ck-%d", i%keys)})
	}
	ids, err := env.Insert(ctx, "leaf", ps)
	must(t, err)
	var longHonouring []int64
	for i, id := range ids {
		if long(i) {
			longHonouring = append(longHonouring, id)
		}
	}

	// Cut it in the middle of its work: when it has a transaction open and
	// runs a long step that honours its context and has more than a lease
	// of work left (begun under 1.5 s ago, of 1.75 leases: its lease
	// deadline comes at most a lease after the cut).
	// A transaction idle for 100–400 ms is in its hold (the idle moments
	// between a transaction's statements last a millisecond), with 400 ms
	// of it left: the cut finds it open.
	freshIdleInTx := func() int {
		n, err := env.Count(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'
			AND state_change BETWEEN clock_timestamp() - interval '400 ms' AND clock_timestamp() - interval '100 ms'`, engineApp)
		must(t, err)
		return n
	}
	time.Sleep(500 * time.Millisecond)
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		running, err := env.Count(ctx, `SELECT count(*) FROM {{s}}.chaos_effects WHERE pid = $1 AND ended IS NULL AND honours
			AND instance = ANY($2) AND started > clock_timestamp() - interval '1.5 s'`, cut.PID, longHonouring)
		must(t, err)
		if running >= 1 && freshIdleInTx() >= 1 {
			break
		}
	}
	proxy.Cut()
	cutAt := time.Now()
	faultID, from, err := env.Fault(ctx, "cut", cut)
	must(t, err)

	// The transactions it left open (a statement the server was running
	// at the cut leaves it idle in transaction a moment later): gone once
	// idle for a lease. Sessions still active are counted too: one in the
	// middle of a statement at the sample (running, waiting on a lock, or
	// on the cut client) is as much an orphan, and must not read as gone.
	openTx := func() int {
		n, err := env.Count(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle'`, engineApp)
		must(t, err)
		return n
	}
	orphans, orphansGone := 0, time.Duration(-1)
	for time.Since(cutAt) < lease+10*time.Second {
		n := openTx()
		orphans = max(orphans, n)
		if n == 0 && time.Since(cutAt) > 200*time.Millisecond {
			orphansGone = time.Since(cutAt)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	// 60 s of work after the cut at CI size (96 rows: done in about 21 s), in
	// proportion at full size: the keys run their rows one at a time, and
	// two workers of four slots serve twelve keys, so the run's length
	// grows with its rows (480 rows took some 3 minutes).
	bound := lease + lease + time.Duration(env.Worker("x").ReaperMs)*time.Millisecond + 60*time.Second*time.Duration(n)/96
	_, live, err := env.WaitTerminal(ctx, cutAt.Add(bound))
	must(t, err)
	afterCut := time.Since(cutAt)

	// The cut worker, still cut off, is asked to stop. Engine.Stop must
	// keep to its context; closing the pool after it may take pgx up to 15 s
	// more (its cancel requests to a server that cannot answer time out) and
	// the pool's PingTimeout (2 s).
	termAt := time.Now()
	stoppedEv, termErr := cut.Term(stopBound + 25*time.Second)
	exited := time.Since(termAt)
	cutStop := time.Duration(-1)
	if stoppedEv != nil {
		cutStop = time.Duration(stoppedEv.Counts["stop_ms"]) * time.Millisecond
	}
	to, err := env.FaultEnd(ctx, faultID)
	must(t, err)
	_, stopErr := fleet.TermAll(30 * time.Second)
	proxy.Close()
	r, err := env.Check(ctx, chaos.CheckOpts{StaleFirstAllowed: true})
	must(t, err)

	// The cut worker's runs in flight at the cut.
	type inFlight struct {
		key        string
		honours    bool
		cause      *string
		workEnd    *time.Time
		committed  bool
		successors int
	}
	var zs []inFlight
	rows, err := env.Admin.Query(ctx, chaos.SQL(env.Schema, `
		SELECT z.pkey, z.honours, z.cause, z.work_end,
		       EXISTS (SELECT 1 FROM {{s}}.chaos_oracle o WHERE o.run_id = z.run_id),
		       (SELECT count(*) FROM {{s}}.chaos_effects x WHERE x.pkey = z.pkey AND x.pid <> z.pid
		          AND x.started > $2 AND x.started < $3)
		FROM {{s}}.chaos_effects z
		WHERE z.pid = $1 AND z.started <= $2 AND (z.ended IS NULL OR z.ended >= $2)`), cut.PID, from, to)
	must(t, err)
	for rows.Next() {
		var z inFlight
		must(t, rows.Scan(&z.key, &z.honours, &z.cause, &z.workEnd, &z.committed, &z.successors))
		zs = append(zs, z)
	}
	rows.Close()
	must(t, rows.Err())
	honouring, cancelled, unexplained, lateEnds, successors := 0, 0, 0, 0, 0
	var lags []time.Duration
	// A run's lease deadline is a lease after its last confirmed heartbeat,
	// at most a heartbeat interval before the cut; the cancellation then
	// reaches the work at once.
	lagLimit := lease + 250*time.Millisecond
	for _, z := range zs {
		successors += z.successors
		if !z.honours {
			continue
		}
		honouring++
		switch {
		case z.cause != nil && *z.cause == "lease_lost":
			cancelled++
		case z.cause == nil && z.workEnd != nil:
			continue // its work was done before its lease ran out; its outcome committed or was fenced
		default:
			unexplained++
			continue
		}
		if z.workEnd == nil {
			unexplained++
			continue
		}
		lag := z.workEnd.Sub(cutAt)
		lags = append(lags, lag)
		if lag > lagLimit {
			lateEnds++
		}
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	goneText := "never (not within lease + 10 s)"
	if orphansGone >= 0 {
		goneText = orphansGone.Round(10*time.Millisecond).String() + " after it"
	}
	lagText := "none"
	if len(lags) > 0 {
		lagText = fmt.Sprintf("%s–%s", lags[0].Round(time.Millisecond), lags[len(lags)-1].Round(time.Millisecond))
	}

	c := &criteria{t: t}
	c.report(r.Violations(false))
	c.check(live == 0, "%d instances still live %s after the cut (bound %s)", live, afterCut.Round(time.Millisecond), bound)
	c.check(honouring > 0, "the cut worker had no step that honours its context in flight: the scenario proved nothing")
	c.check(cancelled > 0, "no run of the cut worker was cancelled by its lease deadline: the scenario proved nothing")
	c.check(orphans > 0, "the cut found no transaction of the worker open: the scenario proved nothing")
	c.check(orphansGone >= 0 && orphansGone <= lease+time.Second,
		"the cut worker's %d open transactions ended %s the cut (want within lease %s + 1 s)", orphans, goneText, lease)
	c.check(successors > 0, "no other worker ran a key of a cut run after the cut: the scenario proved nothing")
	c.check(unexplained == 0, "%d runs in flight in the cut worker (honouring their context) were neither cancelled with ErrLeaseLost nor done with their work", unexplained)
	c.check(lateEnds == 0, "%d of %d cancelled runs ended their work later than %s after the cut (%s)", lateEnds, len(lags), lagLimit, lagText)
	c.check(r.FencedWrites > 0, "no fenced write at all")
	c.check(termErr == nil && cutStop >= 0 && cutStop <= stopBound+time.Second,
		"the cut worker's Engine.Stop took %s (its context: %s), the process exited %s after SIGTERM: %v", cutStop, stopBound, exited, termErr)
	c.check(r.Duplicates <= conc, "%d duplicate step runs > %d (the cut worker's concurrency)", r.Duplicates, conc)
	c.check(stopErr == nil, "graceful stop of the others: %v", stopErr)
	summary(t, r.Line("cutoff", fmt.Sprintf("1 worker of 3 cut off from the database (%d keys, limit 1)", keys))+
		fmt.Sprintf(" (in flight in the cut worker: %d runs honouring their context, %d cancelled with ErrLeaseLost, ending their work %s after the cut; "+
			"%d of its transactions open at the cut, ended by the server %s (lease %s, heartbeat %s); %d runs of its keys by the other workers meanwhile; "+
			"all terminal %s after the cut, bound %s; the cut worker's Engine.Stop took %s (its context %s), its process exited %s after SIGTERM; "+
			"%d overlapping runs of one key among those honouring their context, %d runs started while their key's slot was held; "+
			"fenced resource: %d writes, %d refused, %d from claims no longer current of which %d accepted before any write of a newer claim of their key and %d after one; %s)",
			honouring, cancelled, lagText, orphans, goneText, lease, heartbeat, successors,
			afterCut.Round(100*time.Millisecond), bound, cutStop.Round(100*time.Millisecond), stopBound, exited.Round(100*time.Millisecond),
			r.Overlaps, r.SlotExcess, r.FencedWrites, r.FencedRefused, r.StaleRefused+r.StaleAccepted+r.StaleFirst, r.StaleFirst, r.StaleAccepted, r.Invariants()))
	c.done()
}
