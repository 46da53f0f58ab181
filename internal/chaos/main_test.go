//go:build linux

package chaos_test

import (
	"os"
	"testing"

	"github.com/gendurable/gendurable/internal/chaos"
)

// TestMain turns the test binary into a chaos worker process when the
// harness re-executes it with $CHAOS_WORKER set.
func TestMain(m *testing.M) {
	if os.Getenv(chaos.EnvWorker) != "" {
		os.Exit(chaos.WorkerMain())
	}
	code := m.Run()
	stopPrivateServers()
	os.Exit(code)
}
