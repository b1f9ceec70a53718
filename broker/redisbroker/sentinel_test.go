package redisbroker_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/internal/redistest"
)

// TestSentinelFailover runs a server and producers through Sentinel
// failover clients, kills the master under load and checks that the same
// clients carry on with the promoted replica, accounting for every task
// (the harness is in cluster_test.go).
func TestSentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t)
	old := s.Master.Addr
	var newMaster string
	r := failoverLoad(t, failoverSetup{
		// Each gets a client of its own, as separate processes would.
		newClient: func() redis.UniversalClient { return s.FailoverClient(t) },
		prefix:    redistest.Prefix(t),
		parts:     4,
		kill:      func() { s.Kill(old) },
		healed:    func() { newMaster = s.WaitFailover(t, old, 30*time.Second) },
	})
	r.report(t, "sentinel: master "+old+" + 1 replica, 3 sentinels (quorum 2, down-after "+redistest.SentinelDownAfter.String()+"); killed the master, promoted "+newMaster)
}
