package longhorizon

import (
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestRunSmoke drives the fake adapter (helper_test.go) through every
// phase at second-long durations against the real database: two replicas,
// one SIGKILLed and restarted, the drain count, SIGTERM exits, every output.
func TestRunSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	out := t.TempDir()
	if keep := os.Getenv("LH_TEST_OUT"); keep != "" { // to look at the outputs
		out = keep
	}
	phases := DefaultPhases()
	for i := range phases {
		switch phases[i].Name {
		case PhaseIdleInTx: // a sample sees the held xmin
			phases[i].Duration = 2 * time.Second
		case PhaseHighLoad: // two samples or more: the replicas read the new rate within one
			phases[i].Duration = 2500 * time.Millisecond
		case PhaseKillWorker, PhaseStartWorker: // a sample in each
			phases[i].Duration = time.Second
		default:
			phases[i].Duration = 500 * time.Millisecond
		}
	}
	rep, err := Run(context.Background(), Options{
		DatabaseURL: maintURL(t), Systems: []string{"fake"},
		Commands: map[string][]string{"fake": fakeCommand("fake")},
		Rate:     100, Workers: 2, Replicas: 2, SampleEvery: time.Second, Phases: phases,
		DrainTimeout: 10 * time.Second, DBPrefix: "lhtest_", Out: out,
		Counters: map[string]Counter{"fake": fakeCounter}, Log: testLog{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Runs[0]
	if len(r.Spans) != len(phases) {
		t.Fatalf("ran %d phases, want %d", len(r.Spans), len(phases))
	}
	if len(r.ProtoErrors) > 0 || len(r.Problems) > 0 {
		t.Fatalf("protocol errors %v, problems %v", r.ProtoErrors, r.Problems)
	}
	if r.KillS == 0 || r.RestartS <= r.KillS || r.KilledExit != "signal: killed" {
		t.Fatalf("kill at %vs (%s), restart at %vs", r.KillS, r.KilledExit, r.RestartS)
	}
	if !r.Drain.Counted || r.Drain.Pending != 0 || !r.KillDrain.Counted || r.KillDrain.Pending != 0 {
		t.Fatalf("drain: %+v, after the kill: %+v", r.Drain, r.KillDrain)
	}
	if len(r.Stops) != 2 || !r.Stops[0].Clean || !r.Stops[1].Clean {
		t.Fatalf("stops: %+v", r.Stops)
	}
	if r.Completed < 100 || r.Inserted < 100 {
		t.Fatalf("adapter totals: inserted %v, completed %v", r.Inserted, r.Completed)
	}
	var sawAdapter, sawDB, sawHeld, sawHigh bool
	for _, x := range r.Samples {
		sawAdapter = sawAdapter || !math.IsNaN(x.V["completion_rate"])
		sawDB = sawDB || x.V["live_tuples"] > 0
		sawHeld = sawHeld || x.Phase == PhaseIdleInTx && x.V["xmin_age"] > 0
		// the replicas read the new rate from the control file
		sawHigh = sawHigh || x.Phase == PhaseHighLoad && x.V["offered"] == 150 && x.V["producer_target_rate"] == 75
	}
	if !sawAdapter || !sawDB || !sawHeld || !sawHigh {
		t.Fatalf("samples: adapter %v, database %v, xmin held in idle-in-tx %v, 150/s offered in high-load %v",
			sawAdapter, sawDB, sawHeld, sawHigh)
	}
	for _, f := range []string{"summary.md", "run.json", "latency_p95.png", "completion.png", "dead_tuples.png",
		"table_size.png", "fake/samples.csv", "fake/db.jsonl", "fake/adapter.jsonl", "fake/replica0.log"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Fatalf("output %s: %v", f, err)
		}
	}
	sum, _ := os.ReadFile(filepath.Join(out, "summary.md"))
	for _, want := range []string{"| clean |", "| kill-worker |", "Lost: 0 jobs", "2 of 2 replicas exited 0", "Every job inserted before the SIGKILL finished"} {
		if !strings.Contains(string(sum), want) {
			t.Fatalf("summary.md lacks %q:\n%s", want, sum)
		}
	}
	var js struct{ Runs []SystemRun }
	b, _ := os.ReadFile(filepath.Join(out, "run.json"))
	if err := json.Unmarshal(b, &js); err != nil || len(js.Runs) != 1 || len(js.Runs[0].Spans) != len(phases) {
		t.Fatalf("run.json: %v %s", err, b)
	}
	// The database was dropped at the end.
	conn, err := pgx.Connect(context.Background(), maintURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'lhtest_fake')`).Scan(&exists); err != nil || exists {
		t.Fatalf("lhtest_fake left behind: %v %v", exists, err)
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestRecreateDatabaseRefusesForeign: a database of the run's name that
// the driver did not create is never dropped.
func TestRecreateDatabaseRefusesForeign(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, maintURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, `DROP DATABASE IF EXISTS lhtest_foreign`)
	if _, err := conn.Exec(ctx, `CREATE DATABASE lhtest_foreign`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, `DROP DATABASE IF EXISTS lhtest_foreign`) }() // before conn.Close
	err = recreateDatabase(ctx, maintURL(t), "lhtest_foreign")
	if !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("recreate a foreign database: %v, want ErrInvalidOption", err)
	}
	if err := dropDatabase(ctx, maintURL(t), "lhtest_foreign"); err != nil {
		t.Fatal(err)
	}
	var exists bool
	_ = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'lhtest_foreign')`).Scan(&exists)
	if !exists {
		t.Fatal("dropDatabase dropped a database the driver did not create")
	}
	// One it created is dropped and recreated.
	if err := recreateDatabase(ctx, maintURL(t), "lhtest_mine"); err != nil {
		t.Fatal(err)
	}
	if err := recreateDatabase(ctx, maintURL(t), "lhtest_mine"); err != nil {
		t.Fatal(err)
	}
	if err := dropDatabase(ctx, maintURL(t), "lhtest_mine"); err != nil {
		t.Fatal(err)
	}
}

func TestOptionsValidation(t *testing.T) {
	cmd := map[string][]string{"gendurable": {"x"}}
	for name, o := range map[string]Options{
		"no command":        {Systems: []string{"river"}, Commands: cmd},
		"bad system":        {Systems: []string{"Gen;durable"}, Commands: cmd},
		"duplicate":         {Systems: []string{"gendurable", "gendurable"}, Commands: cmd},
		"negative rate":     {Rate: -1, Commands: cmd},
		"fractional sample": {SampleEvery: 1500 * time.Millisecond, Commands: cmd},
		"kill one replica":  {Replicas: 1, Commands: cmd},
		"bad prefix":        {DBPrefix: "x-y", Commands: cmd},
		"not a url":         {DatabaseURL: "host=x", Commands: cmd},
	} {
		if _, err := o.withDefaults(); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := (&Options{Commands: cmd}).withDefaults(); err != nil {
		t.Fatal(err)
	}
}

func TestScaled(t *testing.T) {
	for _, c := range []struct {
		d     time.Duration
		scale float64
		want  time.Duration
	}{{10 * time.Minute, 0.02, 12 * time.Second}, {time.Minute, 0.001, time.Second}, {500 * time.Millisecond, 0.5, 500 * time.Millisecond}} {
		if got := Scaled(c.d, c.scale); got != c.want {
			t.Errorf("Scaled(%v, %v) = %v, want %v", c.d, c.scale, got, c.want)
		}
	}
}

// TestReportTwoSystems builds two synthetic runs and checks the merge of
// replicas, the summary tables and that every plot is a PNG.
func TestReportTwoSystems(t *testing.T) {
	out := t.TempDir()
	start := time.Unix(1_700_000_000, 0)
	mkRun := func(name string, p95 float64) *SystemRun {
		r := &SystemRun{System: name, Start: start, Descriptor: Descriptor{EventTables: []string{name + "_jobs"}}}
		o := &Options{SampleEvery: time.Second}
		s := &system{o: o, run: r}
		for i, ph := range []string{PhaseWarmup, PhaseClean, PhaseIdleInTx, PhaseRecovery1} {
			r.Spans = append(r.Spans, Span{Name: ph, Start: start.Add(time.Duration(10*i) * time.Second), End: start.Add(time.Duration(10*i+10) * time.Second)})
		}
		r.rates = []rateChange{{start, 100}}
		for sec := 0; sec < 40; sec++ {
			at := start.Add(time.Duration(sec)*time.Second + 30*time.Millisecond) // rounds to the second
			for rep := 0; rep < 2; rep++ {
				v := p95
				if sec >= 20 && sec < 30 {
					v = 10 * p95 // held xmin
				}
				r.Points = append(r.Points,
					Point{T: at, Replica: rep, Metric: MetricClaimP95, Value: v + float64(rep), WindowS: 1},
					Point{T: at, Replica: rep, Metric: MetricCompletion, Value: 50, WindowS: 1},
					Point{T: at, Replica: rep, Metric: MetricEnqueue, Value: 50, WindowS: 1},
					Point{T: at, Replica: rep, Metric: MetricDepth, Value: 3, WindowS: 1})
			}
			r.DBSamples = append(r.DBSamples, DBSample{T: start.Add(time.Duration(sec) * time.Second), WALBytes: int64(sec) << 20,
				Tables: []TableSample{{Table: name + "_jobs", Live: 100, Dead: int64(sec * 10), TotalBytes: int64(sec+1) << 20}}})
		}
		s.finish()
		return r
	}
	gd, rv := mkRun("gendurable", 2), mkRun("river", 5)
	x := gd.Samples[15]
	if len(gd.Samples) != 40 || x.V["completion_rate"] != 100 || x.V["claim_p95_ms"] != 3 || x.V["claim_p95_ms_mean"] != 2.5 ||
		x.V["queue_depth"] != 3 || x.V["replicas"] != 2 || x.V["wal_bytes_per_s"] != 1<<20 || x.Phase != PhaseClean {
		t.Fatalf("merged sample: %+v", x)
	}
	if gd.Inserted != 4000 || gd.Completed != 4000 {
		t.Fatalf("totals %v %v", gd.Inserted, gd.Completed)
	}
	rep := &Report{Options: Options{Out: out, Systems: []string{"gendurable", "river"}, Rate: 100, Replicas: 2, SampleEvery: time.Second, Scale: 1},
		Runs: []*SystemRun{gd, rv}}
	for _, r := range rep.Runs {
		if err := os.MkdirAll(filepath.Join(out, r.System), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteOutputs(rep); err != nil {
		t.Fatal(err)
	}
	sum, _ := os.ReadFile(filepath.Join(out, "summary.md"))
	for _, want := range []string{
		"| clean | 0.17 | 100 | 100 / 100 | 100 % | 3.00 / 3.00 |",
		"| idle-in-tx | 0.17 | 100 | 100 / 100 | 100 % | 21.0 / 21.0 |",
		"### Side by side", "| clean | 100 % | 100 % | 3.00 | 6.00 |",
		"back within the clean phase's range (≤ 3.00 ms, its p95) 0 s after",
	} {
		if !strings.Contains(string(sum), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
	for _, f := range []string{"latency_p95.png", "completion.png", "dead_tuples.png", "table_size.png"} {
		fh, err := os.Open(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(fh)
		fh.Close()
		if err != nil || img.Bounds().Dx() != plotW {
			t.Fatalf("%s: %v", f, err)
		}
	}
}

// TestRunCutShortWritesWhatFinished: when the second system's run fails
// (here its adapter exits without a descriptor), the first system's
// outputs are still written, and the error names the one cut short.
func TestRunCutShortWritesWhatFinished(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	out := t.TempDir()
	phases := DefaultPhases()
	for i := range phases {
		phases[i].Duration = 300 * time.Millisecond
	}
	rep, err := Run(context.Background(), Options{
		DatabaseURL: maintURL(t), Systems: []string{"fake", "broken"},
		Commands: map[string][]string{"fake": fakeCommand("fake"), "broken": {"false"}},
		Rate:     20, Workers: 1, Replicas: 2, SampleEvery: time.Second, Phases: phases,
		DrainTimeout: 10 * time.Second, DBPrefix: "lhtest_", Out: out,
		Counters: map[string]Counter{"fake": fakeCounter}, Log: testLog{t},
	})
	if err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("err = %v, want the broken system's", err)
	}
	if rep == nil || !rep.Partial || len(rep.Runs) == 0 || rep.Runs[0].System != "fake" {
		t.Fatalf("report: %+v", rep)
	}
	sum, rerr := os.ReadFile(filepath.Join(out, "summary.md"))
	if rerr != nil || !strings.Contains(string(sum), "fake") {
		t.Fatalf("summary.md of the finished system: %v\n%s", rerr, sum)
	}
	if !strings.Contains(string(sum), "Cut short: only fake ran to the end of fake, broken.") || strings.Contains(string(sum), "### broken") {
		t.Fatalf("summary.md does not say the run was cut short, or reports the system cut short:\n%s", sum)
	}
}
