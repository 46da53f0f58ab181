// Package gorun ends a program that `go run` started when the go command
// ends. Stopped with SIGTERM (by timeout(1), kill, a supervisor), go run
// exits without passing the signal on, and the program it built goes on
// running, orphaned: the demo with its throwaway PostgreSQL, the quickstart
// with its workers. Ctrl-C on a terminal reaches both (the whole process
// group gets it); this is for the other ways.
//
// It reads the parent's name from /proc, so it acts on Linux only; elsewhere
// Watch returns ctx as it is.
package gorun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// ErrEnded is the cause of a context Watch cancelled: the go command that
// ran this program ended.
var ErrEnded = errors.New("the go command that ran it ended (go run was stopped; it does not pass SIGTERM on)")

// Interval is how often Watch looks at the parent.
const Interval = 250 * time.Millisecond

// Watch returns a context that is also cancelled, with cause [ErrEnded],
// once this process's parent is gone — if that parent is the go command
// (its name is "go"). stop ends the watch.
func Watch(ctx context.Context) (_ context.Context, stop func()) {
	ppid := os.Getppid()
	name, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	if err != nil || strings.TrimSpace(string(name)) != "go" {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if os.Getppid() != ppid { // reparented: the go command is gone
					cancel(ErrEnded)
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(nil) }
}
