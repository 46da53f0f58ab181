// Command gendurable operates gendurable from the shell: schema migrations
// and benchmarks (more commands join as the operator surface grows).
//
//	gendurable migrate up|down|status|print [--schema S]
//	gendurable bench [--workload job|fsm3|signal|fanout|partition] [-n N] [--json]
//	gendurable bench --backlog
//
// The database is --database-url, else DATABASE_URL, else
// postgres://postgres@127.0.0.1:5432/postgres.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
