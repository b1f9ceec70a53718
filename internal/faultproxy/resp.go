package faultproxy

import (
	"bytes"
	"errors"
)

// The two RESP parsers below are incremental: they are fed the bytes of one
// direction of a connection as they arrive, in chunks of any size, and
// report command or reply boundaries as offsets in the whole stream. They
// never buffer a payload: a bulk string is skipped by counting, so their
// memory is a few hundred bytes whatever they are fed. On input that is not
// RESP they return errMalformed and must not be fed again.

// errMalformed is returned by the parsers on bytes that are not RESP.
var errMalformed = errors.New("faultproxy: malformed RESP")

const (
	// maxNumLen bounds the header lines that hold a length or a count.
	maxNumLen = 20
	// maxCapture bounds how much of a command's name and first argument
	// is kept; a longer name is unknown ("") and a longer argument is not
	// matched.
	maxCapture = 64
	// maxInline is Redis's own limit on an inline command line
	// (PROTO_INLINE_MAX_SIZE).
	maxInline = 64 << 10
	// maxCount bounds one aggregate's or bulk string's declared size, and
	// maxNeed the elements a reply may still owe, so that the counters can
	// never overflow.
	maxCount = 1 << 40
	maxNeed  = 1 << 50
)

// reqEventKind tells what a reqEvent reports.
type reqEventKind uint8

const (
	// evCommand: the command starting at off has been identified (its
	// name and, when short enough, its first argument are known). Its bytes
	// from off on must not reach Redis before the event is handled.
	evCommand reqEventKind = iota + 1
	// evCommandEnd: the command's last byte is at off-1.
	evCommandEnd
)

// reqEvent is a command boundary found by reqParser.
type reqEvent struct {
	kind   reqEventKind
	off    int64  // stream offset (see reqEventKind)
	name   string // upper-cased command name; "" when longer than maxCapture
	arg    string // first argument, when hasArg
	hasArg bool   // the command has a first argument of at most maxCapture bytes
}

// reqParser states.
const (
	rqCmd       = iota // at the first byte of a command
	rqInline           // in an inline command line
	rqMultiLen         // in "*<count>" before '\r'
	rqMultiLF          // expecting '\n' after the count
	rqBulkHdr          // expecting '$'
	rqBulkLen          // in "$<len>" before '\r'
	rqBulkLenLF        // expecting '\n' after the length
	rqBulkData         // in a bulk payload
	rqBulkCR           // expecting '\r' after a payload
	rqBulkLF           // expecting '\n' after a payload
	rqBroken           // after an error
)

// reqParser finds commands in the client-to-server stream: RESP arrays of
// bulk strings, and inline commands (a line of space-separated words).
type reqParser struct {
	pos   int64 // stream offset of the next byte
	st    int
	start int64 // offset of the current command's first byte
	num   []byte

	nargs    int64 // arguments still to read
	argi     int   // index of the argument being read
	bulkLeft int64 // payload bytes still to read
	capture  *[]byte
	name     []byte
	arg      []byte
	nameLong bool
	argState int // 0 none, 1 captured, 2 too long
	named    bool

	// inline state
	inlineLen int
	tok       int  // index of the token being read, -1 between tokens
	ntok      int  // tokens seen
	tokLong   bool // the current token is longer than maxCapture
}

func newReqParser() *reqParser {
	return &reqParser{
		num:  make([]byte, 0, maxNumLen),
		name: make([]byte, 0, maxCapture),
		arg:  make([]byte, 0, maxCapture),
	}
}

// offset returns the stream offset of the next byte to be fed.
func (p *reqParser) offset() int64 { return p.pos }

// held returns the offset of the first byte of a command that has not been
// identified yet, or -1. Bytes from there on must be held back until it is
// (at most a few hundred bytes, or one inline line).
func (p *reqParser) held() int64 {
	if p.st == rqCmd || p.st == rqBroken || p.named {
		return -1
	}
	return p.start
}

// feed parses b, appends the events found to evs and returns them. After an
// error the events before it are still valid, and the parser must not be
// fed again.
func (p *reqParser) feed(b []byte, evs []reqEvent) ([]reqEvent, error) {
	if p.st == rqBroken {
		return evs, errMalformed
	}
	for i := 0; i < len(b); {
		c := b[i]
		switch p.st {
		case rqCmd:
			p.start = p.pos + int64(i)
			p.named = false
			p.name = p.name[:0]
			p.arg = p.arg[:0]
			p.nameLong = false
			p.argState = 0
			if c == '*' {
				p.st = rqMultiLen
				p.num = p.num[:0]
				i++
				continue
			}
			p.st = rqInline
			p.inlineLen = 0
			p.tok = -1
			p.ntok = 0
			continue // the byte belongs to the inline line
		case rqInline:
			p.inlineLen++
			if p.inlineLen > maxInline {
				return p.fail(evs)
			}
			switch {
			case c == '\n':
				end := p.pos + int64(i) + 1
				if p.tok >= 0 {
					p.endToken()
				}
				p.st = rqCmd
				if p.ntok > 0 {
					p.name = append(p.name[:0], trimQuotes(p.name)...)
					if p.argState == 1 {
						p.arg = append(p.arg[:0], trimQuotes(p.arg)...)
					}
					evs = p.announce(evs)
					evs = append(evs, reqEvent{kind: evCommandEnd, off: end, name: p.upperName()})
				}
			case isSpace(c):
				if p.tok >= 0 {
					p.endToken()
				}
			default:
				if p.tok < 0 {
					p.tok = p.ntok
					p.ntok++
					p.tokLong = false
				}
				switch p.tok {
				case 0:
					p.name, p.tokLong = appendCapped(p.name, c, p.tokLong)
				case 1:
					p.arg, p.tokLong = appendCapped(p.arg, c, p.tokLong)
				}
			}
			i++
		case rqMultiLen, rqBulkLen:
			if c == '\r' {
				p.st++ // the matching ...LF state
				i++
				continue
			}
			if len(p.num) == maxNumLen {
				return p.fail(evs)
			}
			p.num = append(p.num, c)
			i++
		case rqMultiLF:
			if c != '\n' {
				return p.fail(evs)
			}
			i++
			n, ok := parseInt(p.num)
			if !ok || n > 1<<31-1 {
				return p.fail(evs)
			}
			if n <= 0 {
				// Redis ignores an empty array: no command, no reply.
				p.st = rqCmd
				continue
			}
			p.nargs = n
			p.argi = 0
			p.st = rqBulkHdr
		case rqBulkHdr:
			if c != '$' {
				return p.fail(evs)
			}
			p.num = p.num[:0]
			p.st = rqBulkLen
			i++
		case rqBulkLenLF:
			if c != '\n' {
				return p.fail(evs)
			}
			i++
			n, ok := parseInt(p.num)
			if !ok || n < 0 || n > maxCount {
				return p.fail(evs)
			}
			p.bulkLeft = n
			p.capture = nil
			switch p.argi {
			case 0:
				if n <= maxCapture {
					p.capture = &p.name
				} else {
					p.nameLong = true
					evs = p.announce(evs)
				}
			case 1:
				if n <= maxCapture {
					p.capture = &p.arg
					p.argState = 1
				} else {
					p.argState = 2
					evs = p.announce(evs)
				}
			}
			p.st = rqBulkData
			if n == 0 {
				p.st = rqBulkCR
			}
		case rqBulkData:
			k := int64(len(b) - i)
			if k > p.bulkLeft {
				k = p.bulkLeft
			}
			if p.capture != nil {
				*p.capture = append(*p.capture, b[i:i+int(k)]...)
			}
			p.bulkLeft -= k
			i += int(k)
			if p.bulkLeft == 0 {
				p.st = rqBulkCR
			}
		case rqBulkCR:
			if c != '\r' {
				return p.fail(evs)
			}
			p.st = rqBulkLF
			i++
		case rqBulkLF:
			if c != '\n' {
				return p.fail(evs)
			}
			i++
			p.argi++
			p.nargs--
			if p.argi >= 2 {
				evs = p.announce(evs)
			}
			if p.nargs == 0 {
				evs = p.announce(evs)
				evs = append(evs, reqEvent{kind: evCommandEnd, off: p.pos + int64(i), name: p.upperName()})
				p.st = rqCmd
				continue
			}
			p.st = rqBulkHdr
		}
	}
	p.pos += int64(len(b))
	return evs, nil
}

// fail puts the parser in its broken state.
func (p *reqParser) fail(evs []reqEvent) ([]reqEvent, error) {
	p.st = rqBroken
	return evs, errMalformed
}

// endToken ends the inline token being read.
func (p *reqParser) endToken() {
	switch p.tok {
	case 0:
		p.nameLong = p.tokLong
	case 1:
		p.argState = 1
		if p.tokLong {
			p.argState = 2
		}
	}
	p.tok = -1
}

// announce appends the evCommand event of the current command unless it was
// already reported.
func (p *reqParser) announce(evs []reqEvent) []reqEvent {
	if p.named {
		return evs
	}
	p.named = true
	ev := reqEvent{kind: evCommand, off: p.start, name: p.upperName()}
	if p.argState == 1 {
		ev.arg, ev.hasArg = string(p.arg), true
	}
	return append(evs, ev)
}

// upperName returns the current command's name in upper case, or "" when it
// is unknown.
func (p *reqParser) upperName() string {
	if p.nameLong {
		return ""
	}
	return upper(string(p.name))
}

// appendCapped appends c to b unless b is full, in which case it reports
// that the token is too long.
func appendCapped(b []byte, c byte, long bool) ([]byte, bool) {
	if long || len(b) == maxCapture {
		return b, true
	}
	return append(b, c), false
}

// trimQuotes strips one pair of matching quotes, as Redis's inline parser
// does for a quoted word (escapes inside are not interpreted).
func trimQuotes(b []byte) []byte {
	if len(b) >= 2 && (b[0] == '"' || b[0] == '\'') && b[len(b)-1] == b[0] {
		return b[1 : len(b)-1]
	}
	return b
}

// isSpace reports whether c separates words of an inline command (C isspace
// without '\n', which ends the line).
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'
}

// upper returns s with ASCII letters upper-cased; other bytes are kept, so
// that garbage names stay byte-exact.
func upper(s string) string {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'a' <= b[j] && b[j] <= 'z' {
					b[j] -= 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// parseInt parses an optionally negative decimal integer of at most
// maxNumLen bytes.
func parseInt(b []byte) (int64, bool) {
	neg := false
	if len(b) > 0 && b[0] == '-' {
		neg, b = true, b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// replyEventKind tells what a replyEvent reports.
type replyEventKind uint8

const (
	// evReplyStart: a top-level reply (or push) begins at off.
	evReplyStart replyEventKind = iota + 1
	// evReplyEnd: the top-level reply's last byte is at off-1.
	evReplyEnd
)

// replyEvent is a reply boundary found by replyParser.
type replyEvent struct {
	kind replyEventKind
	off  int64
	push bool // evReplyStart of a RESP3 push frame ('>')
}

// replyParser states.
const (
	rpType   = iota // at a type byte
	rpLine          // in a simple line ('+', '-', ':', ...) before '\r'
	rpLineLF        // expecting '\n' after a simple line
	rpLen           // in a length or count before '\r'
	rpLenLF         // expecting '\n' after it
	rpBulk          // in a bulk payload
	rpBulkCR        // expecting '\r' after a payload
	rpBulkLF        // expecting '\n' after a payload
	rpBroken        // after an error
)

// replyParser finds top-level replies in the server-to-client stream, RESP2
// or RESP3. It tracks only how many elements the current reply still owes
// (an aggregate of n replaces its own slot by n children, a map by 2n, an
// attribute adds 2n before the element it annotates), so nesting costs no
// memory.
type replyParser struct {
	pos      int64
	st       int
	need     int64 // elements the current top-level reply still owes; 0 between replies
	typ      byte
	num      []byte
	bulkLeft int64
}

func newReplyParser() *replyParser {
	return &replyParser{num: make([]byte, 0, maxNumLen)}
}

// offset returns the stream offset of the next byte to be fed.
func (p *replyParser) offset() int64 { return p.pos }

// feed parses b, appends the events found to evs and returns them. After an
// error the events before it are still valid, and the parser must not be
// fed again.
func (p *replyParser) feed(b []byte, evs []replyEvent) ([]replyEvent, error) {
	if p.st == rpBroken {
		return evs, errMalformed
	}
	for i := 0; i < len(b); {
		c := b[i]
		switch p.st {
		case rpType:
			if p.need == 0 {
				evs = append(evs, replyEvent{kind: evReplyStart, off: p.pos + int64(i), push: c == '>'})
				p.need = 1
			}
			i++
			p.typ = c
			switch c {
			case '+', '-', ':', ',', '#', '(', '_':
				p.st = rpLine
			case '$', '!', '=', '*', '~', '%', '>', '|':
				p.st = rpLen
				p.num = p.num[:0]
			default:
				return p.fail(evs)
			}
		case rpLine:
			j := bytes.IndexByte(b[i:], '\r')
			if j < 0 {
				i = len(b)
				continue
			}
			i += j + 1
			p.st = rpLineLF
		case rpLineLF, rpBulkLF:
			if c != '\n' {
				return p.fail(evs)
			}
			i++
			evs = p.done(evs, p.pos+int64(i))
		case rpLen:
			if c == '\r' {
				p.st = rpLenLF
				i++
				continue
			}
			if len(p.num) == maxNumLen {
				return p.fail(evs)
			}
			p.num = append(p.num, c)
			i++
		case rpLenLF:
			if c != '\n' {
				return p.fail(evs)
			}
			i++
			n, ok := parseInt(p.num)
			if !ok || n < -1 || n > maxCount {
				return p.fail(evs)
			}
			end := p.pos + int64(i)
			if n == -1 {
				if p.typ != '$' && p.typ != '*' { // RESP2 nulls only
					return p.fail(evs)
				}
				evs = p.done(evs, end)
				continue
			}
			switch p.typ {
			case '$', '!', '=':
				p.bulkLeft = n
				p.st = rpBulk
				if n == 0 {
					p.st = rpBulkCR
				}
				continue
			case '%':
				p.need += 2*n - 1
			case '|':
				p.need += 2 * n
			default: // '*', '~', '>'
				p.need += n - 1
			}
			if p.need > maxNeed {
				return p.fail(evs)
			}
			p.st = rpType
			if p.need == 0 {
				evs = append(evs, replyEvent{kind: evReplyEnd, off: end})
			}
		case rpBulk:
			k := int64(len(b) - i)
			if k > p.bulkLeft {
				k = p.bulkLeft
			}
			p.bulkLeft -= k
			i += int(k)
			if p.bulkLeft == 0 {
				p.st = rpBulkCR
			}
		case rpBulkCR:
			if c != '\r' {
				return p.fail(evs)
			}
			p.st = rpBulkLF
			i++
		}
	}
	p.pos += int64(len(b))
	return evs, nil
}

// done records that an element ended at end (exclusive).
func (p *replyParser) done(evs []replyEvent, end int64) []replyEvent {
	p.st = rpType
	p.need--
	if p.need == 0 {
		evs = append(evs, replyEvent{kind: evReplyEnd, off: end})
	}
	return evs
}

func (p *replyParser) fail(evs []replyEvent) ([]replyEvent, error) {
	p.st = rpBroken
	return evs, errMalformed
}
