package redisbroker_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Each go-redis client runs a connection reaper until it is closed;
		// tests close theirs in t.Cleanup, which runs after this check could.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}

// env is a broker on a private Redis, under a prefix of the test's own, and
// a client that reads that Redis directly.
type env struct {
	rdb    *redis.Client
	prefix string
	b      *redisbroker.Broker
}

// setup starts (or reuses) a private Redis and returns a broker on it with
// the test's prefix and opts; the broker is closed when the test ends.
func setup(t *testing.T, opts ...redisbroker.Option) env {
	t.Helper()
	e := env{rdb: redistest.Client(t, redistest.Addr(t)), prefix: redistest.Prefix(t)}
	e.b = redisbroker.New(e.rdb, append([]redisbroker.Option{redisbroker.WithPrefix(e.prefix)}, opts...)...)
	t.Cleanup(func() { _ = e.b.Close() })
	return e
}
