package faultproxy

import (
	"net"
	"sync"
	"time"
)

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
