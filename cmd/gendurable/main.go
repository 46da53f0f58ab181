// Command gendurable operates gendurable from the shell: schema migrations,
// inspecting and steering instances and queues, the dashboard, the demo and
// benchmarks (`gendurable help` lists every command).
//
//	gendurable migrate up|down|status|print [--schema S]
//	gendurable status | list | show ID | run-now ID | signal ID NAME
//	gendurable retry|cancel ID... | retry|cancel FILTER --yes (the flags of list, or --all)
//	gendurable pause|resume QUEUE [--create] | queue remove QUEUE
//	gendurable COMMAND --help
//	gendurable bench [--workload job|fsm3|signal|fanout|partition] [-n N] [--json]
//	gendurable bench --backlog
//	gendurable bench --long-horizon   (configured by the environment; see BENCHMARKS.md)
//
// With --json every output, errors included ({"error": {"code", "message",
// "exit_code"}} on stderr), is JSON with snake_case names.
//
// Text output escapes control characters and invalid UTF-8 in whatever it
// prints from the database, so stored names cannot drive the terminal.
//
// The database is --database-url, else DATABASE_URL, else
// postgres://postgres@127.0.0.1:5432/postgres.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gendurable/gendurable/internal/gorun"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// Run by `go run ./cmd/gendurable …` (the README's demo command), it
	// stops with the go command: stopped with SIGTERM, go run exits without
	// passing the signal on, and the demo, its throwaway PostgreSQL or a
	// dashboard would go on running.
	ctx, unwatch := gorun.Watch(ctx)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	unwatch()
	stop()
	os.Exit(code)
}
