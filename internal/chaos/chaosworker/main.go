//go:build linux

// Command chaosworker is a chaos worker process: it runs an engine with the
// harness's machines, configured by the JSON in $CHAOS_WORKER (see
// chaos.WorkerConfig), until SIGTERM. The scenarios normally re-execute
// their own test binary instead; set CHAOS_WORKER_BIN to a build of this
// command to use it.
package main

import (
	"fmt"
	"os"

	"github.com/gendurable/gendurable/internal/chaos"
)

func main() {
	if os.Getenv(chaos.EnvWorker) == "" {
		fmt.Fprintln(os.Stderr, "chaosworker: set $"+chaos.EnvWorker+" to a JSON chaos.WorkerConfig")
		os.Exit(2)
	}
	os.Exit(chaos.WorkerMain())
}
