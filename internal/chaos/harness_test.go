//go:build linux

package chaos_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/chaos"
	"github.com/gendurable/gendurable/internal/pgtemp"
)

// -chaos.full (or CHAOS_FULL=1) runs the scenarios at full size (minutes);
// the default is the bounded CI size (seconds each).
var fullFlag = flag.Bool("chaos.full", false, "run the chaos scenarios at full size")

func full() bool { return *fullFlag || os.Getenv("CHAOS_FULL") == "1" }

// pick returns ci or fullSize depending on the mode.
func pick[T any](ci, fullSize T) T {
	if full() {
		return fullSize
	}
	return ci
}

// newEnv creates the scenario's schema on url; it is dropped when the test
// passes (kept on failure, or always with CHAOS_KEEP=1, for inspection).
func newEnv(t *testing.T, url, name string) *chaos.Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env, err := chaos.NewEnv(ctx, url, name)
	if err != nil {
		t.Fatalf("chaos env on %s: %v", url, err)
	}
	t.Cleanup(func() {
		keep := t.Failed() || os.Getenv("CHAOS_KEEP") == "1"
		if keep {
			t.Logf("schema %s kept for inspection", env.Schema)
		}
		if err := env.Close(keep); err != nil {
			t.Logf("drop schema %s: %v", env.Schema, err)
		}
	})
	return env
}

// newFleet returns a fleet whose workers log into a per-test directory and
// are all killed when the test ends.
func newFleet(t *testing.T) *chaos.Fleet {
	dir := filepath.Join(os.TempDir(), "gendurable-chaos", strings.ReplaceAll(t.Name(), "/", "_")+"-"+time.Now().Format("150405"))
	f := chaos.NewFleet(dir)
	t.Cleanup(func() {
		f.KillAll()
		if t.Failed() {
			t.Logf("worker logs: %s", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	})
	return f
}

// summary prints the scenario's summary line on stdout (and appends it to
// $CHAOS_SUMMARY_FILE when set).
func summary(t *testing.T, line string) {
	t.Helper()
	fmt.Println(line)
	t.Log(line)
	if path := os.Getenv("CHAOS_SUMMARY_FILE"); path != "" {
		if f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
}

// criteria collects failed pass criteria and reports them all at once.
type criteria struct {
	t    *testing.T
	fail []string
}

func (c *criteria) check(ok bool, format string, args ...any) {
	if !ok {
		c.fail = append(c.fail, fmt.Sprintf(format, args...))
	}
}

func (c *criteria) report(vs []string) {
	c.fail = append(c.fail, vs...)
}

func (c *criteria) done() {
	c.t.Helper()
	for _, f := range c.fail {
		c.t.Errorf("criterion failed: %s", f)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func bg(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Private PostgreSQL servers (internal/pgtemp), never the shared one, for
// the scenarios that restart the database.
var (
	privateMu      sync.Mutex
	privateServers []*pgtemp.Server
)

// startPrivateServer starts a private PostgreSQL (synchronous commit on, as
// in production); env is extra environment for its processes.
func startPrivateServer(t *testing.T, env ...string) *pgtemp.Server {
	t.Helper()
	srv, err := pgtemp.Start(context.Background(), pgtemp.Options{
		Settings: map[string]string{"synchronous_commit": "on", "max_connections": "200"},
		Env:      env,
	})
	if err != nil {
		t.Fatalf("private PostgreSQL: %v", err)
	}
	privateMu.Lock()
	privateServers = append(privateServers, srv)
	privateMu.Unlock()
	return srv
}

func stopPrivateServers() {
	privateMu.Lock()
	defer privateMu.Unlock()
	for _, s := range privateServers {
		_ = s.Stop()
	}
	privateServers = nil
}

// killAndRestart SIGKILLs a random worker of the fleet (recording the kill
// first, on the database clock) and starts it again.
func killAndRestart(ctx context.Context, t *testing.T, env *chaos.Env, fleet *chaos.Fleet, cfgs map[string]chaos.WorkerConfig) {
	t.Helper()
	names := fleet.Current()
	victim := names[rand.IntN(len(names))]
	_, _, err := env.Fault(ctx, "kill", victim)
	must(t, err)
	victim.Kill()
	_, err = fleet.Start(cfgs[victim.Name], 0)
	must(t, err)
}
