package dashboard

import (
	"container/list"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

const (
	// loginFailures wrong tokens (login form or bearer) per loginWindow are
	// answered 401 for each client; further wrong tokens from that client
	// are answered 429 until the window ends. A correct token is never
	// refused.
	loginFailures = 10
	loginWindow   = time.Minute
	// maxClients caps how many clients the limiter tracks. Past it, the
	// client that failed least recently is forgotten, so an attacker with
	// many addresses costs a bounded amount of memory (a few hundred bytes
	// a client).
	maxClients = 10000
	// maxClientKey caps the length of a client key that is not an IP.
	maxClientKey = 64
)

// limiter counts wrong tokens per client in fixed windows. It keeps at most
// max clients, least recently failed first out, and forgets clients whose
// window has ended. It is safe for concurrent use.
type limiter struct {
	max int // 0 means maxClients

	mu sync.Mutex
	ll *list.List // of *clientFails, most recently failed first
	m  map[string]*list.Element
}

// clientFails is one client's window.
type clientFails struct {
	key   string
	start time.Time // the window's start
	last  time.Time // the last failure
	fails int       // failures in the window, capped just past the budget
}

// fail records a wrong token from client at now. It returns the number of
// wrong tokens of the client in the current window, this one included
// (capped at loginFailures+2), and when that window ends.
func (l *limiter) fail(client string, now time.Time) (fails int, reset time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.ll, l.m = list.New(), make(map[string]*list.Element)
	}
	// Forget the clients whose window has ended: the list is ordered by the
	// last failure, which is after the window's start.
	for e := l.ll.Back(); e != nil; e = l.ll.Back() {
		c := e.Value.(*clientFails)
		if now.Sub(c.last) < loginWindow {
			break
		}
		l.ll.Remove(e)
		delete(l.m, c.key)
	}
	var c *clientFails
	if e, ok := l.m[client]; ok {
		c = e.Value.(*clientFails)
		l.ll.MoveToFront(e)
	} else {
		limit := l.max
		if limit <= 0 {
			limit = maxClients
		}
		for l.ll.Len() >= limit {
			old := l.ll.Remove(l.ll.Back()).(*clientFails)
			delete(l.m, old.key)
		}
		c = &clientFails{key: client, start: now}
		l.m[client] = l.ll.PushFront(c)
	}
	if now.Sub(c.start) >= loginWindow {
		c.start, c.fails = now, 0
	}
	c.last = now
	if c.fails <= loginFailures+1 {
		c.fails++
	}
	return c.fails, c.start.Add(loginWindow)
}

// clients returns how many clients the limiter tracks.
func (l *limiter) clients() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

// clientKey returns the client r counts against: its remote IP address, or
// the address's /64 network for IPv6 (one host usually has a whole /64).
// Behind a reverse proxy every client has the proxy's address and they
// share one budget, which is harmless: a correct token is never refused.
func clientKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		if len(host) > maxClientKey {
			host = host[:maxClientKey]
		}
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		return netip.PrefixFrom(ip, 64).Masked().String()
	}
	return ip.String()
}
