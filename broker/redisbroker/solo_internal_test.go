package redisbroker

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/internal/redistest"
)

// The kept connection of lone enqueues goes back to the pool, and a checked
// one is taken instead, once it sat unused past soloIdle or was kept past
// soloAge, however busy its caller; before either it is handed out again
// without the pool. The times are set back by hand: no test waits for them.
func TestSoloConnRenewal(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, redistest.Addr(t))
	ctx := context.Background()
	gets := func() uint32 {
		s := rdb.PoolStats()
		return s.Hits + s.Misses
	}
	// use takes the connection, runs one command on it and hands it back,
	// as a lone enqueue does.
	use := func(s *soloConn) *redis.Conn {
		t.Helper()
		c := s.take(rdb)
		if c == nil {
			t.Fatal("take returned no connection for a *redis.Client nobody holds")
		}
		err := c.Ping(ctx).Err()
		s.give(err)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name string
		age  func(s *soloConn) // sets the kept connection's times back
		new  bool              // whether the next take renews it
	}{
		{"FreshIsKept", func(*soloConn) {}, false},
		{"UsedJustBeforeIdleIsKept", func(s *soloConn) { s.used = time.Now().Add(-soloIdle / 2) }, false},
		{"IdleIsRenewed", func(s *soloConn) { s.used = time.Now().Add(-soloIdle - time.Millisecond) }, true},
		{"BusyButOldIsRenewed", func(s *soloConn) { s.taken = time.Now().Add(-soloAge - time.Millisecond) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s soloConn
			t.Cleanup(s.close)
			first := use(&s)
			tc.age(&s)
			before := gets()
			second := use(&s)
			renewed := gets() - before
			if tc.new && (second == first || renewed != 1) {
				t.Fatalf("the kept connection was not renewed: same %v, %d taken from the pool", second == first, renewed)
			}
			if !tc.new && (second != first || renewed != 0) {
				t.Fatalf("the kept connection was renewed: same %v, %d taken from the pool", second == first, renewed)
			}
		})
	}
	t.Run("ErrorGivesItBack", func(t *testing.T) {
		var s soloConn
		t.Cleanup(s.close)
		c := s.take(rdb)
		s.give(context.DeadlineExceeded)
		if s.conn != nil {
			t.Fatal("a connection whose call failed is kept")
		}
		if use(&s) == c {
			t.Fatal("the failed connection was handed out again")
		}
	})
	t.Run("HeldIsNotShared", func(t *testing.T) {
		var s soloConn
		t.Cleanup(s.close)
		c := s.take(rdb)
		if s.take(rdb) != nil {
			t.Fatal("a second caller got the connection another one holds")
		}
		s.give(nil)
		if use(&s) != c {
			t.Fatal("the connection was not kept after its call")
		}
	})
}
