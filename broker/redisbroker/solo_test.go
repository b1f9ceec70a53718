package redisbroker_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
)

// poolGets is how many connections rdb's pool has handed out.
func poolGets(rdb *redis.Client) uint32 {
	s := rdb.PoolStats()
	return s.Hits + s.Misses
}

// A caller enqueuing alone, one task a call, keeps one connection rather
// than taking one from the pool (and having the pool check it) every call.
func TestLoneEnqueueKeepsItsConnection(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := tide.NewClient(e.b)
	ctx := context.Background()
	if _, err := c.Enqueue(ctx, tide.NewTask("warm", nil)); err != nil {
		t.Fatal(err)
	}
	const n = 50
	before := poolGets(e.rdb)
	for range n {
		if _, err := c.Enqueue(ctx, tide.NewTask("t", []byte("p"))); err != nil {
			t.Fatal(err)
		}
	}
	// The kept connection goes back to the pool after a pause between
	// calls: a slow machine may renew it a few times, not every call.
	if got := poolGets(e.rdb) - before; got > n/2 {
		t.Fatalf("%d connections taken from the pool for %d lone enqueues", got, n)
	}
	if n2, err := e.rdb.LLen(ctx, e.prefix+":{default:0}:pending").Result(); err != nil || n2 != n+1 {
		t.Fatalf("%d tasks pending (%v), want %d", n2, err, n+1)
	}
}

// A kept connection that Redis closed meanwhile costs no task: the call on
// it is sent again on a connection from the pool, and stores once.
func TestLoneEnqueueAfterItsConnectionWasKilled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := redistest.Client(t, srv.Addr)
	prefix := redistest.Prefix(t)
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix))
	t.Cleanup(func() { _ = b.Close() })
	c := tide.NewClient(b)
	ctx := context.Background()
	for range 3 {
		if _, err := c.Enqueue(ctx, tide.NewTask("t", nil)); err != nil {
			t.Fatal(err)
		}
	}
	killer := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = killer.Close() })
	if n, err := killer.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Result(); err != nil || n == 0 {
		t.Fatalf("CLIENT KILL: %d, %v", n, err)
	}
	for range 3 {
		if _, err := c.Enqueue(ctx, tide.NewTask("t", nil)); err != nil {
			t.Fatalf("Enqueue after the connections were killed: %v", err)
		}
	}
	if n, err := rdb.HLen(ctx, prefix+":{default:0}:t").Result(); err != nil || n != 6 {
		t.Fatalf("%d tasks stored (%v), want 6", n, err)
	}
}

// Close gives the kept connection back to the pool.
func TestCloseGivesBackTheKeptConnection(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, redistest.Addr(t))
	b := redisbroker.New(rdb, redisbroker.WithPrefix(redistest.Prefix(t)))
	ctx := context.Background()
	if _, err := tide.NewClient(b).Enqueue(ctx, tide.NewTask("t", nil)); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if s := rdb.PoolStats(); s.IdleConns != s.TotalConns {
		t.Fatalf("after Close %d of the pool's %d connections are idle", s.IdleConns, s.TotalConns)
	}
}
