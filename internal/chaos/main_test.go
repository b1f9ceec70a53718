package chaos

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		// Re-executed by TestChaos as a server process (see worker_test.go).
		os.Exit(runWorker())
	}
	goleak.VerifyTestMain(m,
		// go-redis keeps a connection reaper per client until Close, which
		// t.Cleanup calls after the per-package check could run.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}
