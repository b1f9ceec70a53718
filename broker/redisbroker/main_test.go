package redisbroker_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Each go-redis client runs a connection reaper until it is closed;
		// tests close theirs in t.Cleanup, which runs after this check could.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}
