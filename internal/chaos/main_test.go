package chaos

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		// Re-executed by TestChaos (see worker_test.go) or TestFlowModel
		// (flowmodel_worker_test.go) as a server process.
		if os.Getenv(envModel) != "" {
			os.Exit(runModelWorker())
		}
		os.Exit(runWorker())
	}
	goleak.VerifyTestMain(m,
		// go-redis keeps a connection reaper per client until Close, which
		// t.Cleanup calls after the per-package check could run.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}
