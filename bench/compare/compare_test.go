package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
)

// TestMain lets the test binary serve as its own worker processes, as the
// compare command does.
func TestMain(m *testing.M) {
	if IsWorker() {
		os.Exit(WorkerMain())
	}
	os.Exit(m.Run())
}

func testDatabaseURL() string {
	for _, k := range []string{"GENDURABLE_TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(k); u != "" {
			return u
		}
	}
	return DefaultDatabaseURL
}

// testOptions are tiny options on throwaway schemas of the bench database,
// dropped when the test ends.
func testOptions(t *testing.T) Options {
	t.Helper()
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	o := DefaultOptions()
	o.DatabaseURL = testDatabaseURL()
	o.RiverSchema = "river_t" + suffix
	o.GDSchema = "gd_t" + suffix
	o.N = 200
	o.Rounds = 1
	o.InsertBatch = 75 // several batches, the last one short
	o.StatsRows = 2000
	o.PoolConns = 4
	o.Settings = []string{SettingBest, "10"}
	o.Procs = []int{1, 2}
	o.ProcsSettings = []string{"10"}
	o.GDBest.Concurrency = 20
	o.GDBest.Prefetch = 20
	o.RiverMaxWorkers = 50
	o.Rates = []int{200}
	o.ContinuousDuration = 500 * time.Millisecond
	o.ContinuousWorkers = 10
	o.IdleWait = 300 * time.Millisecond
	o.ContinuousSettle = 200 * time.Millisecond
	o.ContinuousWarmup = 100 * time.Millisecond
	// Library defaults would leave an idle queue unpolled for up to 5 s.
	o.ContinuousGD = gendurable.QueueConfig{PollInterval: 50 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond}
	o.InsertN = 150
	o.LimitDuration = 200 * time.Millisecond
	o.RunTimeout = 60 * time.Second
	t.Cleanup(func() {
		admin, err := openPool(context.Background(), &o, 1, "gendurable-bench-test")
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer admin.Close()
		if err := dropSchemas(context.Background(), admin, &o); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	return o
}

// TestRunSmall runs every mode at tiny sizes against the real database:
// throughput with one and two worker processes, continuous with its idle
// probe, and the insert paths.
func TestRunSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := testOptions(t)
	var progress bytes.Buffer
	o.Progress = &progress

	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	// Cases best, 10, 10x2p; two systems each.
	if got, want := len(rep.Results), 6; got != want {
		t.Fatalf("%d throughput results, want %d", got, want)
	}
	procs := map[int]int{}
	for _, r := range rep.Results {
		procs[r.Procs]++
		if r.DBCompleted != int64(o.N) || r.JobsPerSec <= 0 || r.InsertRowsPerSec <= 0 || r.Anomalies != 0 {
			t.Errorf("bad result %+v", r)
		}
		if r.StatsFinishedFrac < 0.9 {
			t.Errorf("%s %s: statistics say %.2f finished, want a table in use", r.System, r.Setting, r.StatsFinishedFrac)
		}
	}
	if procs[1] != 4 || procs[2] != 2 {
		t.Errorf("process counts %v", procs)
	}
	if len(rep.Limits) != 1 || rep.Limits[0].Rows <= 0 || math.IsNaN(float64(rep.LimitFractionGendurable)) {
		t.Errorf("limit %+v, fraction %v", rep.Limits, rep.LimitFractionGendurable)
	}
	if got, want := len(rep.Continuous), 2; got != want {
		t.Fatalf("%d continuous results, want %d", got, want)
	}
	for _, c := range rep.Continuous {
		steady := c.Inserted - c.WarmupJobs
		if c.Inserted == 0 || steady <= 0 || c.Pickup.N != steady || c.Complete.N != steady || c.Anomalies != 0 {
			t.Errorf("bad continuous result %+v", c)
		}
		if c.Pickup.P50Milli < 0 || c.Complete.P50Milli < c.Pickup.P50Milli-1e-9 && c.Complete.N > 1 {
			t.Errorf("latencies out of order %+v", c)
		}
		if c.IdlePickupMillis < 0 || c.IdleCompleteMillis < 0 {
			t.Errorf("idle probe not measured %+v", c)
		}
	}
	if got, want := len(rep.Inserts), 3; got != want {
		t.Fatalf("%d insert results, want %d", got, want)
	}
	for _, x := range []Ratio{rep.RatioInsert, rep.RatioJobsBest, rep.RatioInsertMany, rep.RatioInsertManyFast} {
		if math.IsNaN(float64(x)) || x <= 0 {
			t.Errorf("ratio %v", x)
		}
	}
	if got := len(rep.RatioJobs); got != 3 {
		t.Errorf("%d case ratios, want 3", got)
	}

	var out bytes.Buffer
	if err := rep.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "ratio gendurable/river jobs_per_sec: ") {
		t.Errorf("last line %q", last)
	}
	for _, want := range []string{"jobs_per_sec@10x2p: ", "insert_rows_per_sec@InsertManyFast: ", "idle pickup", "physical limit: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("json: %v", err)
	}
	for _, k := range []string{"ratio_jobs_per_sec", "continuous", "inserts", "ratios_jobs_per_sec"} {
		if _, ok := back[k]; !ok {
			t.Errorf("json lacks %q", k)
		}
	}
	t.Logf("\n%s", out.String())
}

// TestResetStatistics: the default reset leaves statistics of a mostly
// finished table over an empty one; FreshStats leaves none.
func TestResetStatistics(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := testOptions(t)
	if err := ensureDatabase(ctx, &o); err != nil {
		t.Fatal(err)
	}
	admin, err := openPool(ctx, &o, 2, "gendurable-bench-test")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := migrateAll(ctx, admin, &o); err != nil {
		t.Fatal(err)
	}
	for _, system := range []string{SystemRiver, SystemGendurable} {
		o.FreshStats = false
		frac, err := reset(ctx, admin, &o, system)
		if err != nil {
			t.Fatalf("%s reset: %v", system, err)
		}
		if frac < 0.9 {
			t.Errorf("%s: realistic statistics say %.2f finished", system, frac)
		}
		if _, total, err := dbCounts(ctx, admin, &o, system); err != nil || total != 0 {
			t.Errorf("%s: %d rows left (%v)", system, total, err)
		}
		o.FreshStats = true
		if frac, err = reset(ctx, admin, &o, system); err != nil {
			t.Fatalf("%s fresh reset: %v", system, err)
		}
		if frac != 0 {
			t.Errorf("%s: fresh statistics say %.2f finished", system, frac)
		}
	}
}

func TestMedianAndRatios(t *testing.T) {
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median odd = %v", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median even = %v", got)
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of nothing should be NaN")
	}
	rep := &Report{Results: []Result{
		{System: SystemRiver, Setting: SettingBest, Procs: 1, JobsPerSec: 100, InsertRowsPerSec: 1000},
		{System: SystemGendurable, Setting: SettingBest, Procs: 1, JobsPerSec: 150, InsertRowsPerSec: 3000},
		{System: SystemRiver, Setting: "100", Procs: 2, JobsPerSec: 50, InsertRowsPerSec: 1000},
		{System: SystemGendurable, Setting: "100", Procs: 2, JobsPerSec: 100, InsertRowsPerSec: 3000},
		{System: SystemRiver, Setting: SettingBest, Procs: 1, JobsPerSec: 200, InsertRowsPerSec: 1000},
		{System: SystemGendurable, Setting: SettingBest, Procs: 1, JobsPerSec: 250, InsertRowsPerSec: 3000},
	}, Inserts: []InsertResult{
		{Path: PathRiverInsertMany, RowsPerSec: 1000},
		{Path: PathGDInsertMany, RowsPerSec: 3000},
		{Path: PathRiverInsertManyFast, RowsPerSec: 6000},
	}}
	rep.finish()
	if rep.RatioJobsBest != 200.0/150.0 || rep.RatioInsert != 3 || rep.RatioInsertMany != 3 || rep.RatioInsertManyFast != 0.5 {
		t.Errorf("ratios %v %v %v %v", rep.RatioJobsBest, rep.RatioInsert, rep.RatioInsertMany, rep.RatioInsertManyFast)
	}
	if len(rep.Medians) != 4 || len(rep.RatioJobs) != 2 || rep.RatioJobs[1].Case != "100x2p" || rep.RatioJobs[1].Ratio != 2 {
		t.Errorf("medians %+v ratios %+v", rep.Medians, rep.RatioJobs)
	}
	var out bytes.Buffer
	if err := rep.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ratio gendurable/river insert_rows_per_sec: 3.00\n",
		"ratio gendurable/river insert_rows_per_sec@InsertMany: 3.00\n",
		"ratio gendurable/river insert_rows_per_sec@InsertManyFast: 0.50\n",
		"ratio gendurable/river jobs_per_sec@100x2p: 2.00\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.HasSuffix(out.String(), "ratio gendurable/river jobs_per_sec: 1.33\n") {
		t.Errorf("last line wrong:\n%s", out.String())
	}
	// A missing side is n/a in text and null in JSON.
	empty := &Report{}
	empty.finish()
	out.Reset()
	if err := empty.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), "ratio gendurable/river jobs_per_sec: n/a\n") {
		t.Errorf("empty report:\n%s", out.String())
	}
	out.Reset()
	if err := empty.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"ratio_jobs_per_sec": null`) {
		t.Errorf("json: %s", out.String())
	}
}

func TestDist(t *testing.T) {
	var xs []time.Duration
	for i := 100; i >= 1; i-- {
		xs = append(xs, time.Duration(i)*time.Millisecond)
	}
	d := dist(xs)
	if d.N != 100 || d.P50Milli != 50 || d.P99Milli != 99 || d.MaxMilli != 100 {
		t.Errorf("dist %+v", d)
	}
	if d := dist(nil); d.N != 0 {
		t.Errorf("empty dist %+v", d)
	}
	l := newLatencyRec()
	l.picked(1, NoopArgs{Num: 0, Ins: 1})
	l.picked(2, NoopArgs{Num: idleNum, Ins: 1})
	l.picked(3, NoopArgs{Num: 1})                       // no timestamp: not measured
	l.picked(4, NoopArgs{Num: 2, Ins: 1, Warmup: true}) // warm-up: not measured
	l.completed(4, 9)
	l.completed(1, 5)
	l.completed(2, 7)
	l.completed(3, 9)
	r := l.report()
	if r.Pickup.N != 1 || r.Complete.N != 1 || r.Idle.PickupMillis < 0 || r.Idle.CompleteMillis != ms(6) {
		t.Errorf("report %+v", r)
	}
}

func TestCases(t *testing.T) {
	o := DefaultOptions()
	var keys []string
	for _, c := range o.cases() {
		keys = append(keys, c.key())
	}
	if got, want := strings.Join(keys, " "), "best 10 100 1000 100x2p 100x4p"; got != want {
		t.Errorf("cases %q, want %q", got, want)
	}
	if err := o.validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	o.Settings = []string{"many"}
	if err := o.validate(); err == nil {
		t.Error("bad setting accepted")
	}
	o = DefaultOptions()
	o.Procs = []int{1, 9} // 90 connections
	if err := o.validate(); err == nil {
		t.Error("too many connections accepted")
	}
	d := DefaultOptions()
	s := d.setting("10")
	if s.riverMaxWorkers != 10 || s.gd.Concurrency != 10 || s.gd.MinDemand != 10 {
		t.Errorf("setting 10: %+v", s)
	}
}
