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
