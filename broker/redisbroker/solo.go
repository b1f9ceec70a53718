package redisbroker

import (
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// soloIdle is how long the kept connection of a lone enqueue (soloConn) may
// sit unused and still be used without the pool's health check: past it, it
// goes back to the pool and the next lone enqueue takes one from the pool
// again, checked.
const soloIdle = 200 * time.Millisecond

// soloAge is how long a connection is kept at most before it goes back to
// the pool and is taken again (checked). go-redis skips its peek for push
// notifications before a command only within 5s of the connection's last
// return to the pool; a connection kept longer would pay that system call
// on every command.
const soloAge = time.Second

// soloConn is a connection kept for single enqueues made while no other is
// on the wire (the commonest call: one caller enqueuing in a loop). Through
// go-redis's pool every call takes a connection and puts it back, and the
// pool checks each idle connection it hands out with a system call (a
// non-blocking peek at the socket) before the command is written; a kept
// connection skips both. It is kept only for a *redis.Client (one server)
// and used by one call at a time (a second concurrent call goes through the
// pool). It goes back to the pool after soloIdle unused, soloAge after it
// was taken (about one checked pool round a second for a busy caller),
// after any error and on Close; the next lone call then takes a checked
// connection from the pool. A call whose outcome an error left unknown is
// sent again as any other, and the scripts answer it like the first run.
// go-redis copies the client's hooks into the kept connection when it is
// taken: a hook added to the client later applies to lone enqueues once the
// connection is renewed, within soloAge.
type soloConn struct {
	mu    sync.Mutex
	conn  *redis.Conn
	taken time.Time // when conn was taken from the pool
	used  time.Time // when conn last answered
	shut  bool      // the broker is closed: keep nothing
}

// take returns the kept connection, taking one from rdb's pool if none is
// kept or it sat unused past soloIdle or was kept past soloAge, or nil when
// rdb is not a *redis.Client or another call holds it. A non-nil connection
// must be handed back with give.
func (s *soloConn) take(rdb redis.UniversalClient) *redis.Conn {
	c, ok := rdb.(*redis.Client)
	if !ok || !s.mu.TryLock() {
		return nil
	}
	if s.shut {
		s.mu.Unlock()
		return nil
	}
	now := time.Now()
	if s.conn != nil && (now.Sub(s.used) > soloIdle || now.Sub(s.taken) > soloAge) {
		_ = s.conn.Close()
		s.conn = nil
	}
	if s.conn == nil {
		s.conn, s.taken = c.Conn(), now
	}
	return s.conn
}

// give hands back the connection take returned, with the error of the call
// made on it: after any error the connection goes back to the pool, which
// closes it if go-redis marked it broken (a reply of Redis such as READONLY
// can mark it so too; the script's own refusals are rare enough that taking
// a fresh connection after them costs nothing).
func (s *soloConn) give(err error) {
	if err != nil && !errors.Is(err, redis.Nil) {
		_ = s.conn.Close()
		s.conn = nil
	} else {
		s.used = time.Now()
	}
	s.mu.Unlock()
}

// close gives the kept connection back to the pool for good: Close waits
// for a call on it to end.
func (s *soloConn) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shut = true
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn = nil
	}
}
