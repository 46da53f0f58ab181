package gendurabletest_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/gendurable/gendurable/gendurabletest"
)

// fakeTB records what a helper reports, so tests can check that it fails
// and what it says. FailNow ends the goroutine, as testing's does: run the
// helper with run.
type fakeTB struct {
	testing.TB // the real test, for Context, Deadline, Cleanup, TempDir
	mu         sync.Mutex
	failed     bool
	msgs       []string
}

func newFakeTB(t *testing.T) *fakeTB { return &fakeTB{TB: t} }

func (f *fakeTB) Helper() {}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = true
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Fatalf(format string, args ...any) { f.Errorf(format, args...); f.FailNow() }
func (f *fakeTB) Fatal(args ...any)                 { f.Errorf("%s", fmt.Sprint(args...)); f.FailNow() }
func (f *fakeTB) FailNow()                          { runtime.Goexit() }
func (f *fakeTB) Skipf(format string, args ...any) {
	f.Errorf("SKIP "+format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Logf(format string, args ...any) {}

// run calls fn with f in a goroutine of its own and reports whether it failed.
func (f *fakeTB) run(fn func(tb testing.TB)) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

func (f *fakeTB) message() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.msgs, "\n")
}

func itoa(n int64) string { return fmt.Sprint(n) }

func databaseURL() string {
	if u := os.Getenv(gendurabletest.DatabaseURLEnv); u != "" {
		return u
	}
	return os.Getenv("DATABASE_URL")
}

// exampleTB stands in for the *testing.T of a test in the examples: it
// panics where a test would fail, and end runs the cleanups.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func exampleT() *exampleTB { return &exampleTB{} }

func (e *exampleTB) Helper()                           {}
func (e *exampleTB) Cleanup(f func())                  { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Log(args ...any)                   {}
func (e *exampleTB) Logf(format string, args ...any)   {}
func (e *exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleTB) Skipf(format string, args ...any)  { panic(fmt.Sprintf(format, args...)) }

func (e *exampleTB) end() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
