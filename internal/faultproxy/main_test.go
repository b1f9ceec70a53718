package faultproxy

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when any goroutine outlives the tests: every
// Proxy is closed and every client closed by t.Cleanup, so a goroutine left
// behind is one that Close did not wait for.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
