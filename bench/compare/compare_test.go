package compare

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
)

func testDatabaseURL() string {
	for _, k := range []string{"GENDURABLE_TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(k); u != "" {
			return u
		}
	}
	return DefaultDatabaseURL
}

// TestRunSmall runs one tiny round of each system in both settings against
// the real database, in throwaway schemas of the bench database.
func TestRunSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	suffix := fmt.Sprintf("%08x", rand.Uint32())
	o := DefaultOptions()
	o.DatabaseURL = testDatabaseURL()
	o.RiverSchema = "river_t" + suffix
	o.GDSchema = "gd_t" + suffix
	o.N = 200
	o.Rounds = 1
	o.InsertBatch = 75 // several batches, the last one short
	o.EqualWorkers = 10
	o.GDBest.Concurrency = 20
	o.GDBest.Prefetch = 20
	o.RiverMaxWorkers = 50
	o.RunTimeout = 60 * time.Second
	var progress bytes.Buffer
	o.Progress = &progress

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

	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if got, want := len(rep.Results), 4; got != want {
		t.Fatalf("%d results, want %d", got, want)
	}
	for _, r := range rep.Results {
		if r.DBCompleted != int64(o.N) || r.JobsPerSec <= 0 || r.InsertRowsPerSec <= 0 || r.Anomalies != 0 {
			t.Errorf("bad result %+v", r)
		}
	}
	for _, x := range []float64{rep.RatioInsert, rep.RatioJobsBest, rep.RatioJobsEqual} {
		if math.IsNaN(x) || x <= 0 {
			t.Errorf("ratio %v", x)
		}
	}

	var out bytes.Buffer
	if err := rep.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "ratio gendurable/river jobs_per_sec: ") {
		t.Errorf("last line %q", last)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"ratio_jobs_per_sec":`) {
		t.Errorf("json lacks the ratio: %s", js.String())
	}
	t.Logf("\n%s", out.String())
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
		{System: SystemRiver, Setting: SettingBest, JobsPerSec: 100, InsertRowsPerSec: 1000},
		{System: SystemGendurable, Setting: SettingBest, JobsPerSec: 150, InsertRowsPerSec: 3000},
		{System: SystemRiver, Setting: SettingBest, JobsPerSec: 200, InsertRowsPerSec: 1000},
		{System: SystemGendurable, Setting: SettingBest, JobsPerSec: 250, InsertRowsPerSec: 3000},
	}}
	rep.finish()
	if rep.RatioJobsBest != 200.0/150.0 || rep.RatioInsert != 3 || !math.IsNaN(rep.RatioJobsEqual) {
		t.Errorf("ratios %v %v %v", rep.RatioJobsBest, rep.RatioInsert, rep.RatioJobsEqual)
	}
	var out bytes.Buffer
	if err := rep.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ratio gendurable/river insert_rows_per_sec: 3.00\n",
		"ratio gendurable/river jobs_per_sec@equal: n/a\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.HasSuffix(out.String(), "ratio gendurable/river jobs_per_sec: 1.33\n") {
		t.Errorf("last line wrong:\n%s", out.String())
	}
}
