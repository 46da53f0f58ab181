// Command river-long-horizon is River's adapter of the public long-horizon
// benchmark, configured by the environment only (package riverlh; the same
// variables and output as `gendurable bench --long-horizon`, see
// BENCHMARKS.md): JSON lines on stdout, logs on stderr, until SIGTERM (exit
// 0 within 5 s). A wrong environment is exit 2.
//
//	cd bench && DATABASE_URL=... PRODUCER_RATE=200 WORKER_COUNT=8 go run ./cmd/river-long-horizon
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gendurable/gendurable/bench/riverlh"
	"github.com/gendurable/gendurable/internal/longhorizon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := riverlh.Run(ctx, os.Getenv, os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, longhorizon.ErrInvalidEnv):
		fmt.Fprintln(os.Stderr, "river-long-horizon:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "river-long-horizon:", err)
		os.Exit(1)
	}
}
