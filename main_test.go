package gendurable_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// engine, feeder, heartbeat and pool must stop cleanly.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
