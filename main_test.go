package gendurable_test

import (
	"os"
	"testing"

	"github.com/gendurable/gendurable/internal/dbtest"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// engine, feeder, heartbeat and pool must stop cleanly. The examples, written
// to be copied, connect to DATABASE_URL; it is set to the test database
// (GENDURABLE_TEST_DATABASE_URL, else DATABASE_URL, else the local server),
// which gendurabletest.NewDB then uses too.
func TestMain(m *testing.M) {
	_ = os.Setenv("DATABASE_URL", dbtest.URL())
	goleak.VerifyTestMain(m)
}
