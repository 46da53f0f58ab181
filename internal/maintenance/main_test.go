package maintenance

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// service loop must have returned once Stop has.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
