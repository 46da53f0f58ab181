package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/jackc/pgx/v5"
)

func databaseURL() string {
	for _, k := range []string{"GENDURABLE_TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(k); u != "" {
			return u
		}
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// adapterEnv is the adapter's environment: the test's, without any protocol
// variable, plus kv.
func adapterEnv(kv ...string) []string {
	var env []string
	for _, e := range os.Environ() {
		if k, _, _ := strings.Cut(e, "="); !strings.Contains(" DATABASE_URL SCENARIO PRODUCER_MODE PRODUCER_RATE TARGET_DEPTH WORKER_COUNT JOB_PAYLOAD_BYTES JOB_WORK_MS SAMPLE_EVERY_S BENCH_INSTANCE_ID PRODUCER_RATE_CONTROL_FILE RIVER_SCHEMA ", " "+k+" ") {
			env = append(env, e)
		}
	}
	return append(env, kv...)
}

// TestProtocol runs the adapter as the benchmark's harness does: descriptor
// first, then every SAMPLE_EVERY_S one line per metric with the protocol's
// fields, jobs produced and completed, and SIGTERM → exit 0 within 5 s.
func TestProtocol(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "river-long-horizon")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	schema := fmt.Sprintf("river_lh_%08x", rand.Uint32())
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, databaseURL())
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	url := databaseURL()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	cmd := exec.Command(bin)
	cmd.Env = adapterEnv("DATABASE_URL="+url+sep+"pool_max_conns=6", "RIVER_SCHEMA="+schema,
		"SCENARIO=long_horizon", "PRODUCER_MODE=fixed", "PRODUCER_RATE=100", "WORKER_COUNT=8", "SAMPLE_EVERY_S=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() map[string]any {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("stdout closed early; stderr:\n%s", stderr.String())
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("not a JSON line: %q", l)
			}
			return m
		case <-time.After(60 * time.Second):
			t.Fatalf("no line in 60s; stderr:\n%s", stderr.String())
			return nil
		}
	}
	d := next()
	if d["kind"] != "descriptor" || d["system"] != "river" || fmt.Sprint(d["event_tables"]) != "["+schema+".river_job]" ||
		fmt.Sprint(d["extensions"]) != "[]" || d["version"] == "" || d["schema_version"] == "" || d["db_name"] == "" || d["started_at"] == "" {
		t.Fatalf("descriptor: %v", d)
	}
	want := []string{"claim_p50_ms", "claim_p95_ms", "claim_p99_ms", "enqueue_rate", "completion_rate", "queue_depth", "producer_target_rate"}
	windows := map[string]float64{"claim_p50_ms": 30, "claim_p95_ms": 30, "claim_p99_ms": 30, "enqueue_rate": 1, "completion_rate": 1, "queue_depth": 0, "producer_target_rate": 0}
	last := map[string]float64{}
	for tick := 0; tick < 4; tick++ {
		at := ""
		for _, metric := range want {
			s := next()
			ts, err := time.Parse(time.RFC3339Nano, fmt.Sprint(s["t"]))
			if len(s) != 9 || s["metric"] != metric || s["system"] != "river" || s["kind"] != "adapter" || s["subject_kind"] != "adapter" ||
				s["subject"] != "" || s["window_s"] != windows[metric] || s["instance_id"] != float64(0) || err != nil || ts.Nanosecond() != 0 {
				t.Fatalf("tick %d, want %s: %v", tick, metric, s)
			}
			if at == "" {
				at = s["t"].(string)
			} else if s["t"] != at {
				t.Fatalf("two timestamps in one tick: %v", s)
			}
			last[metric] = s["value"].(float64)
		}
	}
	if last["producer_target_rate"] != 100 || last["enqueue_rate"] < 50 || last["completion_rate"] <= 0 || last["claim_p50_ms"] <= 0 ||
		last["claim_p99_ms"] < last["claim_p95_ms"] || last["claim_p95_ms"] < last["claim_p50_ms"] {
		t.Fatalf("last tick: %v", last)
	}

	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		for l := range lines {
			if !json.Valid([]byte(l)) {
				exited <- fmt.Errorf("not a JSON line after SIGTERM: %q", l)
				return
			}
		}
		exited <- cmd.Wait()
	}()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(8 * time.Second):
		t.Fatalf("still running 8 s after SIGTERM; stderr:\n%s", stderr.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("exit took %v after SIGTERM", d)
	}

	// A wrong environment: exit 2, a message naming the variable.
	bad := exec.Command(bin)
	bad.Env = adapterEnv("DATABASE_URL="+url, "PRODUCER_RATE=200")
	out, err := bad.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "WORKER_COUNT is not set") {
		t.Fatalf("bad environment: %v\n%s", err, out)
	}
}

// TestReplicasStartedAtOnceAndAStopUnderALock: two replicas started at
// once on a fresh schema both migrate and run (rivermigrate takes no lock:
// one of them failed on the other's CREATE TYPE), and SIGTERM ends each
// within 5 s even while another session holds river_job locked, so that a
// fetch of River's waits on it (the pool's close waited for that fetch: 7 s).
func TestReplicasStartedAtOnceAndAStopUnderALock(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "river-long-horizon")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx := context.Background()
	schema := fmt.Sprintf("river_lh_%08x", rand.Uint32())
	admin, err := pgx.Connect(ctx, databaseURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Logf("cleanup: %v", err)
		}
		admin.Close(ctx)
	})
	url := databaseURL()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	type replica struct {
		cmd    *exec.Cmd
		stderr *syncbuf.Buffer
		lines  chan string
	}
	var rs []replica
	for i := 0; i < 2; i++ {
		cmd := exec.Command(bin)
		cmd.Env = adapterEnv("DATABASE_URL="+url+sep+"pool_max_conns=4", "RIVER_SCHEMA="+schema, fmt.Sprintf("BENCH_INSTANCE_ID=%d", i),
			"PRODUCER_RATE=50", "WORKER_COUNT=2", "SAMPLE_EVERY_S=1")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		r := replica{cmd: cmd, stderr: &syncbuf.Buffer{}, lines: make(chan string, 1024)}
		cmd.Stderr = r.stderr
		rs = append(rs, r)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				r.lines <- sc.Text()
			}
			close(r.lines)
		}()
	}
	for _, r := range rs {
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = r.cmd.Process.Kill() }()
	}
	for i, r := range rs {
		// The descriptor and a first sample line.
		for n := 0; n < 2; n++ {
			select {
			case _, ok := <-r.lines:
				if !ok {
					_ = r.cmd.Wait()
					t.Fatalf("replica %d ended early; stderr:\n%s", i, r.stderr.String())
				}
			case <-time.After(60 * time.Second):
				t.Fatalf("replica %d: no line in 60s", i)
			}
		}
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+schema+".river_job IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // River's fetches, every 50 ms, now wait on the lock
	start := time.Now()
	for _, r := range rs {
		if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range rs {
		go func() {
			for range r.lines {
			}
		}()
		exited := make(chan error, 1)
		go func() { exited <- r.cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("replica %d: exit after SIGTERM: %v; stderr:\n%s", i, err, r.stderr.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("replica %d still running 10 s after SIGTERM; stderr:\n%s", i, r.stderr.String())
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the replicas took %v to exit after SIGTERM under a lock", d)
	}
}
