// Package chaos holds fault-injection helpers and the chaos tests of tide:
// a TCP proxy that can cut every connection between the servers and Redis,
// and a redis-server that can be killed and restarted on the same port and
// data directory. The tests (chaos_test.go, reconnect_test.go) run servers as
// separate processes, kill them, restart Redis and cut the network, then
// check that no task was lost and that duplicates stay within what the
// at-least-once contract allows.
package chaos

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a target address.
// Cut drops every connection and refuses new ones for a while, which looks to
// a client like Redis going away: the TCP connect succeeds (the kernel
// completes it) and the connection is then reset before any reply. Refused
// connection attempts are counted, so a test can tell back-off from a busy
// loop. A Proxy is safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener

	mu          sync.Mutex
	conns       map[net.Conn]struct{}
	refuseUntil time.Time
	closed      bool

	accepted, refused, dialFailed atomic.Int64
	wg                            sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection at once and refuses new ones (accepts and
// resets them) for d, then forwards again. It returns at once; a second Cut
// while one is in force extends it to the later of the two ends.
func (p *Proxy) Cut(d time.Duration) {
	p.mu.Lock()
	if until := time.Now().Add(d); until.After(p.refuseUntil) {
		p.refuseUntil = until
	}
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		reset(c)
	}
}

// Down reports whether a cut is in force.
func (p *Proxy) Down() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Now().Before(p.refuseUntil)
}

// Refused returns the number of connection attempts refused during cuts.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// Accepted returns the number of connections forwarded to the target.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// DialFailed returns the number of connections dropped because the target
// could not be reached (Redis down).
func (p *Proxy) DialFailed() int64 { return p.dialFailed.Load() }

// Close stops listening, closes every connection and waits for the
// forwarding goroutines to exit.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	err := p.ln.Close()
	for c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
	return err
}

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
		down := time.Now().Before(p.refuseUntil)
		p.mu.Unlock()
		if down {
			p.refused.Add(1)
			reset(c)
			continue
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *Proxy) forward(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		p.dialFailed.Add(1)
		reset(c)
		return
	}
	p.mu.Lock()
	if p.closed || time.Now().Before(p.refuseUntil) {
		// Closed or cut while dialling.
		p.mu.Unlock()
		reset(c)
		_ = up.Close()
		return
	}
	p.conns[c] = struct{}{}
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	p.accepted.Add(1)

	var once sync.Once
	end := func() {
		once.Do(func() {
			reset(c)
			_ = up.Close()
			p.mu.Lock()
			delete(p.conns, c)
			delete(p.conns, up)
			p.mu.Unlock()
		})
	}
	var g sync.WaitGroup
	g.Go(func() { _, _ = io.Copy(up, c); end() })
	g.Go(func() { _, _ = io.Copy(c, up); end() })
	g.Wait()
}

// reset closes c with an RST rather than a FIN, as a crashed peer or a
// dropped route would look.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
