// Package faultproxy is a RESP-aware fault-injection TCP proxy for tests: it
// sits between a Redis client and a real redis-server and can delay or drop
// the replies of chosen commands, hold requests, stall every connection,
// cut connections and refuse new ones.
//
// It exists to reproduce what a slow or broken network does to a client
// that re-sends a command whose reply timed out: go-redis retries a command
// (EVALSHA, a whole pipeline) after a read timeout or a broken connection,
// and Redis then runs it twice. For example:
//
//	p, err := faultproxy.New(redisAddr)
//	...
//	defer p.Close()
//	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: 200 * time.Millisecond})
//	p.DelayReplies(faultproxy.Commands("INCR"), 500*time.Millisecond, 1)
//	rdb.Incr(ctx, "k") // times out, is retried: the key is now 2
//
// The proxy parses the client-to-server stream as RESP commands (arrays of
// bulk strings, or inline commands) and the server-to-client stream as RESP2
// or RESP3 replies, and pairs them in order, as Redis answers in order on a
// connection. The package imports only the standard library.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// dialTimeout bounds the connection to the target.
	dialTimeout = 2 * time.Second
	// bufSize is the read buffer of each direction of a connection.
	bufSize = 32 << 10
	// maxQueue bounds the faulted replies a connection may owe before the
	// proxy stops pairing replies on it.
	maxQueue = 1 << 16
	// drainLimit bounds how long a dropped reply's reset waits for the
	// client to receive the replies sent before it.
	drainLimit = time.Second
	// maxSeenNames bounds the distinct command names Seen remembers.
	maxSeenNames = 4096
)

// Proxy forwards TCP connections accepted on a loopback port to a Redis
// server and injects faults into them. Every method is safe for concurrent
// use, also after Close (faults and pauses then have no effect).
//
// A connection's replies are paired with its commands until the connection
// leaves the one-reply-per-command pattern: when the client sends SUBSCRIBE,
// PSUBSCRIBE, SSUBSCRIBE, one of their UNSUBSCRIBE counterparts, MONITOR,
// SYNC, PSYNC or CLIENT REPLY, when Redis sends a RESP3 push frame (pub/sub
// messages under HELLO 3, client-side caching invalidations), or when either
// stream is not valid RESP. From then on the proxy forwards that
// connection's replies untouched and no reply fault applies to it; if the
// client stream is not RESP, the proxy also stops looking for its commands
// (Seen no longer counts them, DelayRequests no longer holds them). Pause
// and Cut apply to every connection.
//
// A connection ends when either side closes it (a client's half-close is
// not propagated: the proxy closes both sides). The zero Proxy is not
// usable: create one with New. Methods never panic on a Proxy made by New.
type Proxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // canceled by Close, aborts dials
	cancel context.CancelFunc

	mu          sync.Mutex
	links       map[*link]struct{}
	refuseUntil time.Time
	closed      bool
	resume      chan struct{} // non-nil while paused, closed by Resume
	faults      []*fault
	seen        map[string]int64

	accepted, refused, dialFailed, dropped atomic.Int64
	wg                                     sync.WaitGroup
}

// New listens on a free 127.0.0.1 port and forwards each accepted
// connection to target (host:port), which is dialled, with a 2 s timeout,
// only when a connection is accepted (target is not checked before). The
// returned Proxy has no faults, is not paused and refuses nothing. The
// error, prefixed "faultproxy:", is that of listening. Call Close to release
// the port and the goroutines. It does not panic.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target: target,
		ln:     ln,
		ctx:    ctx,
		cancel: cancel,
		links:  map[*link]struct{}{},
		seen:   map[string]int64{},
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the address clients connect to, "127.0.0.1:port". Safe for
// concurrent use.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops listening, resets every connection (TCP RST to the client
// and to Redis) and waits until every goroutine of the proxy has exited,
// including delayed replies and paused transfers, which are abandoned. It is
// idempotent and safe for concurrent use: later calls wait the same way and
// return nil. The error, prefixed "faultproxy:", is that of closing the
// listener.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	links := p.links
	p.links = nil
	// A pause stays in force: releasing it could let a paused connection
	// forward bytes before it is reset.
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	for l := range links {
		l.end(true)
	}
	p.wg.Wait()
	if err != nil {
		return fmt.Errorf("faultproxy: close listener: %w", err)
	}
	return nil
}

// Pause stops forwarding bytes in both directions on every connection,
// open or accepted later, until Resume: connections stay open, bytes
// already read by the proxy are held, and the rest wait in the kernel's
// buffers. Connections accepted during a pause are connected to Redis but
// get nothing forwarded. Pausing a paused proxy does nothing. Safe for
// concurrent use; it does not panic.
func (p *Proxy) Pause() {
	p.mu.Lock()
	if p.resume == nil && !p.closed {
		p.resume = make(chan struct{})
	}
	p.mu.Unlock()
}

// Resume ends a Pause; held bytes are forwarded in order. Resuming a proxy
// that is not paused does nothing. Safe for concurrent use; it does not
// panic.
func (p *Proxy) Resume() {
	p.mu.Lock()
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
	p.mu.Unlock()
}

// Cut resets every open connection at once (TCP RST to the client) and
// refuses new ones for d: they are accepted, as the kernel completes the
// handshake anyway, and reset before any byte is forwarded, which looks to
// a client like Redis going away. It returns at once; a second Cut while
// one is in force extends it to the later of the two ends; d <= 0 only
// resets the open connections. Safe for concurrent use; it does not panic.
func (p *Proxy) Cut(d time.Duration) {
	p.mu.Lock()
	if until := time.Now().Add(d); until.After(p.refuseUntil) {
		p.refuseUntil = until
	}
	links := p.links
	if !p.closed {
		p.links = map[*link]struct{}{}
	}
	p.mu.Unlock()
	for l := range links {
		l.end(true)
	}
}

// Down reports whether a Cut is in force. Safe for concurrent use.
func (p *Proxy) Down() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Now().Before(p.refuseUntil)
}

// Seen returns how many commands named name (case-insensitive) the proxy
// has forwarded to Redis in full so far, on every connection, counting
// each command of a pipeline or a MULTI block, retries included. A command
// is counted just before the write of its last byte, so it is counted by
// the time its reply can reach the client (and also if that write then
// fails). Commands on a connection whose client stream stopped being RESP
// are not counted, nor names longer than 64 bytes. Safe for concurrent use.
func (p *Proxy) Seen(name string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[upper(name)]
}

// Dropped returns how many replies DropReplies has dropped. Safe for
// concurrent use.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Accepted returns how many connections were forwarded to the target (the
// target accepted them). Safe for concurrent use.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Refused returns how many connections were refused during a Cut. Safe for
// concurrent use.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// DialFailed returns how many connections were reset because the target
// could not be reached (Redis down). Safe for concurrent use.
func (p *Proxy) DialFailed() int64 { return p.dialFailed.Load() }

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		p.mu.Lock()
		closed, down := p.closed, time.Now().Before(p.refuseUntil)
		if !closed && !down {
			p.wg.Add(1)
		}
		p.mu.Unlock()
		switch {
		case closed:
			reset(c)
		case down:
			p.refused.Add(1)
			reset(c)
		default:
			go p.serve(c)
		}
	}
}

// serve dials the target for the client connection c and forwards between
// them until either side ends, a fault resets it, Cut or Close.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: dialTimeout}
	up, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		p.dialFailed.Add(1)
		reset(c)
		return
	}
	l := &link{p: p, c: c, up: up, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || time.Now().Before(p.refuseUntil) {
		// Closed or cut while dialling.
		p.mu.Unlock()
		reset(c)
		reset(up)
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	p.accepted.Add(1)

	var g sync.WaitGroup
	g.Go(l.requests)
	g.Go(l.replies)
	g.Wait()
}

// link is one proxied connection: the client's c and Redis's up. Its
// requests goroutine owns the request-side state and its replies goroutine
// the reply-side state; they share only q.
type link struct {
	p     *Proxy
	c, up net.Conn
	done  chan struct{} // closed by end
	once  sync.Once
	q     replyQueue
}

// end closes both connections, with an RST to the client when rst, and
// stops the link's goroutines. It is idempotent.
func (l *link) end(rst bool) {
	l.once.Do(func() {
		close(l.done)
		if rst {
			reset(l.c)
			reset(l.up)
		} else {
			_ = l.c.Close()
			_ = l.up.Close()
		}
		l.p.mu.Lock()
		delete(l.p.links, l) // no-op when Cut or Close took the map
		l.p.mu.Unlock()
	})
}

// wait blocks while the proxy is paused; it reports false when the link
// ended meanwhile.
func (l *link) wait() bool {
	for {
		l.p.mu.Lock()
		ch := l.p.resume
		l.p.mu.Unlock()
		if ch == nil {
			select {
			case <-l.done:
				return false
			default:
				return true
			}
		}
		select {
		case <-ch:
		case <-l.done:
			return false
		}
	}
}

// sleep waits d; it reports false when the link ended meanwhile.
func (l *link) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.done:
		return false
	}
}

// send writes b to w once the proxy is not paused; it reports false when
// the link ended or the write failed.
func (l *link) send(w net.Conn, b []byte) bool {
	if len(b) == 0 {
		return true
	}
	if !l.wait() {
		return false
	}
	_, err := w.Write(b)
	return err == nil
}

// requests forwards the client's bytes to Redis, finding commands on the
// way to count them, hold them (DelayRequests) and attach reply faults.
func (l *link) requests() {
	defer l.end(false)
	rs := reqState{parser: newReqParser()}
	buf := make([]byte, bufSize)
	for {
		n, err := l.c.Read(buf)
		if n > 0 && !l.handleRequests(&rs, buf[:n]) {
			return
		}
		if err != nil {
			return
		}
	}
}

// reqState is the request side of a link.
type reqState struct {
	parser *reqParser // nil once the stream is not RESP
	evs    []reqEvent
	out    []byte  // bytes read and not yet forwarded, from stream offset sent
	sent   int64   // stream offset of out[0]
	ends   []ended // commands not yet forwarded in full
}

type ended struct {
	off  int64
	name string
}

func (l *link) handleRequests(rs *reqState, chunk []byte) bool {
	if rs.parser == nil {
		return l.send(l.up, chunk)
	}
	rs.out = append(rs.out, chunk...)
	var err error
	rs.evs, err = rs.parser.feed(chunk, rs.evs[:0])
	for _, ev := range rs.evs {
		switch ev.kind {
		case evCommand:
			if d := l.command(ev); d > 0 {
				if !l.flush(rs, ev.off) || !l.sleep(d) {
					return false
				}
			}
		case evCommandEnd:
			rs.ends = append(rs.ends, ended{ev.off, ev.name})
		}
	}
	if err != nil {
		// Not RESP: forward the rest as it is and stop interpreting.
		rs.parser = nil
		l.q.unpair()
		return l.flush(rs, rs.sent+int64(len(rs.out)))
	}
	to := rs.parser.held()
	if to < 0 {
		to = rs.parser.offset()
	}
	return l.flush(rs, to)
}

// flush forwards the buffered request bytes up to stream offset to and
// counts the commands forwarded in full. They are counted just before the
// write, so that Seen includes a command by the time its reply can reach
// the client.
func (l *link) flush(rs *reqState, to int64) bool {
	k := int(to - rs.sent)
	if k <= 0 {
		return true
	}
	if !l.wait() {
		return false
	}
	n := 0
	for n < len(rs.ends) && rs.ends[n].off <= to {
		n++
	}
	if n > 0 {
		l.p.count(rs.ends[:n])
		rs.ends = rs.ends[:copy(rs.ends, rs.ends[n:])]
	}
	if _, err := l.up.Write(rs.out[:k]); err != nil {
		return false
	}
	rs.out = rs.out[:copy(rs.out, rs.out[k:])]
	rs.sent = to
	return true
}

// count adds forwarded commands to Seen.
func (p *Proxy) count(cmds []ended) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cmds {
		if c.name == "" {
			continue
		}
		if _, ok := p.seen[c.name]; ok || len(p.seen) < maxSeenNames {
			p.seen[c.name]++
		}
	}
}

// command applies the faults to a command just identified: it queues the
// action for its reply (before any of its bytes reach Redis, so before its
// reply can come) and returns how long to hold it.
func (l *link) command(ev reqEvent) time.Duration {
	if unpairs(ev) {
		l.q.unpair()
	}
	p := l.p
	var hold time.Duration
	l.q.mu.Lock()
	p.mu.Lock()
	if f := p.takeLocked(ev.name, ev.arg, ev.hasArg, delayRequest); f != nil {
		hold = f.d
	}
	if !l.q.ended {
		var act replyAction
		if f := p.takeLocked(ev.name, ev.arg, ev.hasArg, delayReply, dropReply); f != nil {
			act = replyAction{kind: f.kind, d: f.d}
		}
		l.q.pushLocked(act)
	}
	p.mu.Unlock()
	l.q.mu.Unlock()
	return hold
}

// unpairs reports whether the command ends the one-reply-per-command
// pattern on its connection.
func unpairs(ev reqEvent) bool {
	switch ev.name {
	case "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE",
		"MONITOR", "SYNC", "PSYNC":
		return true
	case "CLIENT":
		return ev.hasArg && upper(ev.arg) == "REPLY"
	}
	return false
}

// replies forwards Redis's bytes to the client, finding replies on the way
// to apply the reply faults queued by requests.
func (l *link) replies() {
	defer l.end(false)
	rs := replyState{parser: newReplyParser()}
	buf := make([]byte, bufSize)
	for {
		n, err := l.up.Read(buf)
		if n > 0 && !l.handleReplies(&rs, buf[:n]) {
			return
		}
		if err != nil {
			return
		}
	}
}

// replyState is the reply side of a link.
type replyState struct {
	parser   *replyParser // nil once replies are forwarded raw
	evs      []replyEvent
	dropping bool // discarding the reply to drop
}

// handleReplies forwards one chunk from Redis; it returns false when the
// link ended.
func (l *link) handleReplies(rs *replyState, chunk []byte) bool {
	if rs.parser == nil {
		return l.send(l.c, chunk)
	}
	base := rs.parser.offset()
	var err error
	rs.evs, err = rs.parser.feed(chunk, rs.evs[:0])
	w := 0 // chunk bytes forwarded or discarded
	for _, ev := range rs.evs {
		off := int(ev.off - base)
		switch ev.kind {
		case evReplyStart:
			act, paired := l.q.pop()
			if ev.push || !paired {
				// A push, or a connection no longer paired: raw from here.
				l.q.unpair()
				rs.parser = nil
				return l.send(l.c, chunk[w:])
			}
			switch act.kind {
			case delayReply:
				if !l.send(l.c, chunk[w:off]) || !l.sleep(act.d) {
					return false
				}
				w = off
			case dropReply:
				if !l.send(l.c, chunk[w:off]) {
					return false
				}
				w = off
				rs.dropping = true
			}
		case evReplyEnd:
			if rs.dropping {
				l.dropEnd()
				return false
			}
		}
	}
	if rs.dropping {
		if err != nil {
			l.dropEnd()
			return false
		}
		return true // discard the rest of the chunk
	}
	if err != nil {
		// Not RESP: forward as it is from here.
		l.q.unpair()
		rs.parser = nil
	}
	return l.send(l.c, chunk[w:])
}

// dropEnd completes a dropped reply: it counts it, lets the client receive
// the replies forwarded before it (the kernel would discard them on reset
// otherwise), waiting at most drainLimit, and resets the connection.
func (l *link) dropEnd() {
	l.p.dropped.Add(1)
	for deadline := time.Now().Add(drainLimit); unsent(l.c) > 0 && time.Now().Before(deadline); {
		if !l.sleep(time.Millisecond) {
			return
		}
	}
	l.end(true)
}

// replyQueue holds, in order, what to do with the replies a connection's
// commands are owed. Runs of plain commands take one entry.
type replyQueue struct {
	mu    sync.Mutex
	items []queued
	ended bool // replies are no longer paired
}

type queued struct {
	plain int64 // > 0: that many commands with no reply fault
	act   replyAction
}

// pushLocked queues the action for the next command's reply. q.mu must be
// held and q not ended.
func (q *replyQueue) pushLocked(act replyAction) {
	if act.kind == 0 {
		if n := len(q.items); n > 0 && q.items[n-1].plain > 0 {
			q.items[n-1].plain++
			return
		}
		q.items = append(q.items, queued{plain: 1})
		return
	}
	if len(q.items) >= maxQueue {
		q.ended, q.items = true, nil
		return
	}
	q.items = append(q.items, queued{act: act})
}

// pop returns the action for the next reply. paired is false when replies
// are no longer paired and every queued action has been used. A reply no
// command is waiting for (an unsolicited error before Redis closes the
// connection) gets no fault.
func (q *replyQueue) pop() (act replyAction, paired bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return replyAction{}, !q.ended
	}
	it := &q.items[0]
	if it.plain > 0 {
		it.plain--
		if it.plain == 0 {
			q.items = q.items[1:]
		}
		return replyAction{}, true
	}
	q.items = q.items[1:]
	return it.act, true
}

// unpair stops queueing: the replies already owed keep their actions,
// later ones are forwarded raw.
func (q *replyQueue) unpair() {
	q.mu.Lock()
	q.ended = true
	q.mu.Unlock()
}

// reset closes c with an RST rather than a FIN, as a crashed peer or a
// dropped route would look.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
