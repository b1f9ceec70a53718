package chaos

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		// Re-executed by TestChaos (see worker_test.go), TestFlowModel or
		// TestLimitModel (modelproc_test.go) as a server process.
		switch os.Getenv(envModel) {
		case "fm":
			os.Exit(runModelWorker())
		case "lm":
			os.Exit(runLimitWorker())
		}
		os.Exit(runWorker())
	}
	goleak.VerifyTestMain(m,
		// go-redis keeps a connection reaper per client until Close, which
		// t.Cleanup calls after the per-package check could run.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}
