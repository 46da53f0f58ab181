package gendurabletest_test

import (
	"os"
	"testing"

	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/gendurable/gendurable/internal/dbtest"
	"go.uber.org/goleak"
)

// TestMain points NewDB at the project's test database when neither
// variable is set (so these tests run, as the rest of the suite does,
// against the local server), and fails the package if a test leaves a
// goroutine behind.
func TestMain(m *testing.M) {
	if os.Getenv(gendurabletest.DatabaseURLEnv) == "" && os.Getenv("DATABASE_URL") == "" {
		_ = os.Setenv(gendurabletest.DatabaseURLEnv, dbtest.URL())
	}
	goleak.VerifyTestMain(m)
}
