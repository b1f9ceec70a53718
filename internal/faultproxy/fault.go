package faultproxy

import (
	"slices"
	"time"
)

// Match selects commands by name, case-insensitively, and optionally by
// their first argument (usually the key). The zero Match selects every
// command. A Match is an immutable value, safe to share between goroutines.
type Match struct {
	names  []string // upper-cased; empty = every command
	arg    string
	hasArg bool
}

// Commands returns a Match selecting the commands with any of the given
// names (case-insensitive), for example Commands("EVALSHA", "EVAL"). With no
// names it selects every command. Only the command name is compared: a
// subcommand (CLIENT SETNAME) is selected by its command (CLIENT). Names
// longer than 64 bytes never match, and a command whose name is longer than
// that is selected only by a Match without names. It does not panic.
func Commands(names ...string) Match {
	m := Match{names: make([]string, len(names))}
	for i, n := range names {
		m.names[i] = upper(n)
	}
	return m
}

// WithFirstArg returns a copy of m that also requires the command's first
// argument (for most commands the key) to equal arg byte for byte, for
// example Commands("INCR").WithFirstArg("k3"). An arg longer than 64 bytes
// never matches, nor does a command without arguments. It does not panic.
func (m Match) WithFirstArg(arg string) Match {
	m.names = slices.Clone(m.names)
	m.arg, m.hasArg = arg, true
	return m
}

// matches reports whether m selects the command name (upper-cased) with the
// first argument arg (valid when hasArg).
func (m Match) matches(name, arg string, hasArg bool) bool {
	if m.hasArg && (!hasArg || arg != m.arg) {
		return false
	}
	return len(m.names) == 0 || (name != "" && slices.Contains(m.names, name))
}

// faultKind is what a fault does to the commands it matches.
type faultKind uint8

const (
	delayReply faultKind = iota + 1
	dropReply
	delayRequest
)

// fault is one pending fault of a Proxy, guarded by Proxy.mu.
type fault struct {
	kind faultKind
	m    Match
	d    time.Duration
	left int // commands it still applies to; -1 = until Clear
}

// replyAction is what happens to one command's reply.
type replyAction struct {
	kind faultKind // 0 (forward), delayReply or dropReply
	d    time.Duration
}

// DelayReplies makes the replies to the next n commands matching m, counted
// across all connections, reach the client d late: the command is forwarded
// to Redis and runs at once, its reply is held by the proxy for d from when
// it arrives, and so is everything that follows it on that connection, as
// on a slow link. A client whose read timeout is shorter than d sees a
// timeout after the command ran. n <= 0 applies the fault to every matching
// command until Clear; d <= 0 delays nothing but still uses up the count.
// Faults are checked in the order they were added; a command gets at most
// one reply fault (DelayReplies or DropReplies), and only on a connection
// whose replies the proxy can still pair with commands (see Proxy). Inside
// MULTI, the reply delayed is the +QUEUED one. Safe for concurrent use; it
// does not panic.
func (p *Proxy) DelayReplies(m Match, d time.Duration, n int) {
	p.addFault(delayReply, m, d, n)
}

// DropReplies makes the proxy swallow the replies to the next n commands
// matching m, counted across all connections: the command is forwarded and
// runs, Redis's reply is read and discarded, and then the client's
// connection is reset (TCP RST), so the client sees a broken connection
// after its command ran. The replies before it on that connection are
// delivered first (on Linux the reset waits, at most 1 s, until the client
// has received them); commands pipelined after it may or may not have run. Dropped counts the replies dropped. n <= 0 applies
// the fault to every matching command until Clear. See DelayReplies for the
// order of faults and the connections they apply to. Safe for concurrent
// use; it does not panic.
func (p *Proxy) DropReplies(m Match, n int) {
	p.addFault(dropReply, m, 0, n)
}

// DelayRequests holds the next n commands matching m, counted across all
// connections, for d before they reach Redis; what follows such a command
// on its connection waits behind it. The delay starts when the proxy has
// read enough of the command to identify it. n <= 0 applies the fault to
// every matching command until Clear; d <= 0 delays nothing but still uses
// up the count. A command may get both a request delay and a reply fault.
// Safe for concurrent use; it does not panic.
func (p *Proxy) DelayRequests(m Match, d time.Duration, n int) {
	p.addFault(delayRequest, m, d, n)
}

// Clear removes every pending fault. Faults already attached to a command
// the proxy has read (a reply being delayed or awaited to be dropped, a
// request being held) still complete. Safe for concurrent use; it does not
// panic.
func (p *Proxy) Clear() {
	p.mu.Lock()
	p.faults = nil
	p.mu.Unlock()
}

func (p *Proxy) addFault(kind faultKind, m Match, d time.Duration, n int) {
	if n <= 0 {
		n = -1
	}
	if d < 0 {
		d = 0
	}
	p.mu.Lock()
	p.faults = append(p.faults, &fault{kind: kind, m: m, d: d, left: n})
	p.mu.Unlock()
}

// takeLocked returns the first pending fault of one of the kinds that
// matches the command and uses one of its count, or nil. p.mu must be held.
func (p *Proxy) takeLocked(name, arg string, hasArg bool, kinds ...faultKind) *fault {
	for i, f := range p.faults {
		if !slices.Contains(kinds, f.kind) || !f.m.matches(name, arg, hasArg) {
			continue
		}
		if f.left > 0 {
			f.left--
			if f.left == 0 {
				p.faults = slices.Delete(p.faults, i, i+1)
			}
		}
		return f
	}
	return nil
}
