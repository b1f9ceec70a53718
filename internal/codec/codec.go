// Package codec encodes task messages into the compact binary record the Redis
// broker stores as one hash field per task.
//
// A record is a fixed 28-byte header followed by three variable sections:
//
//	off len field
//	0   1   version (1)
//	1   1   state (broker.State)
//	2   4   token: deliveries so far, the fencing token of the current lease
//	6   2   retried
//	8   2   max retry
//	10  6   process-at, Unix ms (0 = unset)
//	16  6   last-failed-at, Unix ms (0 = never)
//	22  4   body length B
//	26  2   unique-key length U
//	28  B   body (Go only, see below)
//	28+B U  unique key
//	..  *   last error (to the end)
//
// Integers are big-endian and unsigned; 48 bits of milliseconds reach the
// year 10889, and times before 1970 are stored as unset. The header has fixed
// offsets so the Lua scripts can read and patch state, token, retried and due
// time, replace the last error and find the unique key without understanding
// the body. The body holds, in order: type, payload, headers (count then
// key/value pairs), enqueued-at, completed-at, timeout, deadline, retention and
// unique TTL, each a length-prefixed string or a varint (times in Unix ms,
// durations in ms). Enqueued-at is absolute: the scripts patch process-at in
// place, so nothing may be stored relative to it.
//
// The ID and queue are not stored: they are the hash field and the key.
package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tidequeue/tide/broker"
)

// Header layout; keep in sync with the Lua scripts.
const (
	Version    = 1
	HeaderSize = 28

	offState     = 1
	offToken     = 2
	offRetried   = 6
	offMaxRetry  = 8
	offProcessAt = 10
	offFailedAt  = 16
	offBodyLen   = 22
	offUniqLen   = 26

	// MaxCount is the largest retry count or MaxRetry a record holds.
	MaxCount = math.MaxUint16
)

// Limits that Decode enforces so that corrupt input cannot make it allocate
// without bound.
const (
	maxHeaders = 1 << 12
)

// ErrCorrupt is wrapped by every Decode error.
var ErrCorrupt = errors.New("tide: corrupt task record")

// Encode returns the record for m with the given token.
func Encode(m *broker.Message, token uint64) []byte {
	body := make([]byte, 0, 32+len(m.Type)+len(m.Payload))
	body = appendString(body, m.Type)
	body = appendBytes(body, m.Payload)
	body = binary.AppendUvarint(body, uint64(len(m.Headers)))
	for k, v := range m.Headers {
		body = appendString(body, k)
		body = appendString(body, v)
	}
	body = binary.AppendVarint(body, ms(m.EnqueuedAt))
	body = binary.AppendVarint(body, ms(m.CompletedAt))
	body = binary.AppendUvarint(body, uint64(m.Timeout/time.Millisecond))
	body = binary.AppendVarint(body, ms(m.Deadline))
	body = binary.AppendUvarint(body, uint64(m.Retention/time.Millisecond))
	body = binary.AppendUvarint(body, uint64(m.UniqueTTL/time.Millisecond))

	uniq := m.UniqueKey
	if len(uniq) > 0xffff {
		uniq = uniq[:0xffff] // keys are digests; never this long in practice
	}
	out := make([]byte, HeaderSize, HeaderSize+len(body)+len(uniq)+len(m.LastErr))
	out[0] = Version
	out[offState] = byte(m.State)
	binary.BigEndian.PutUint32(out[offToken:], uint32(token))
	binary.BigEndian.PutUint16(out[offRetried:], clampU16(m.Retried))
	binary.BigEndian.PutUint16(out[offMaxRetry:], clampU16(m.MaxRetry))
	putU48(out[offProcessAt:], ms(m.ProcessAt))
	putU48(out[offFailedAt:], ms(m.LastFailedAt))
	binary.BigEndian.PutUint32(out[offBodyLen:], uint32(len(body)))
	binary.BigEndian.PutUint16(out[offUniqLen:], uint16(len(uniq)))
	out = append(out, body...)
	out = append(out, uniq...)
	out = append(out, m.LastErr...)
	return out
}

// Decode parses a record. queue and id are filled in from where the record
// was found. It returns the message and its token; any malformation is
// reported as an error wrapping ErrCorrupt, never a panic.
func Decode(queue, id string, b []byte) (*broker.Message, uint64, error) {
	if len(b) < HeaderSize {
		return nil, 0, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrCorrupt, len(b), HeaderSize)
	}
	if b[0] != Version {
		return nil, 0, fmt.Errorf("%w: unknown version %d", ErrCorrupt, b[0])
	}
	st := broker.State(b[offState])
	if st < broker.StatePending || st > broker.StateCompleted {
		return nil, 0, fmt.Errorf("%w: unknown state %d", ErrCorrupt, b[offState])
	}
	bodyLen := int(binary.BigEndian.Uint32(b[offBodyLen:]))
	uniqLen := int(binary.BigEndian.Uint16(b[offUniqLen:]))
	if bodyLen > len(b)-HeaderSize || uniqLen > len(b)-HeaderSize-bodyLen {
		return nil, 0, fmt.Errorf("%w: section lengths %d+%d exceed record size %d", ErrCorrupt, bodyLen, uniqLen, len(b))
	}
	m := &broker.Message{
		ID:           id,
		Queue:        queue,
		State:        st,
		Retried:      int(binary.BigEndian.Uint16(b[offRetried:])),
		MaxRetry:     int(binary.BigEndian.Uint16(b[offMaxRetry:])),
		ProcessAt:    fromMS(u48(b[offProcessAt:])),
		LastFailedAt: fromMS(u48(b[offFailedAt:])),
	}
	token := uint64(binary.BigEndian.Uint32(b[offToken:]))
	body := b[HeaderSize : HeaderSize+bodyLen]
	m.UniqueKey = string(b[HeaderSize+bodyLen : HeaderSize+bodyLen+uniqLen])
	m.LastErr = string(b[HeaderSize+bodyLen+uniqLen:])

	if len(body) == 0 {
		// An empty body is what the scripts write for a record they had to
		// archive as unreadable: no type, no payload.
		return m, token, nil
	}
	r := reader{b: body}
	if err := decodeBody(&r, m); err != nil {
		return nil, 0, err
	}
	return m, token, nil
}

// DecodeHeader parses only the header, unique key and last error of a
// record: what is left to show of a record whose body is corrupt (the
// scripts archive such records, and an operator still needs to see them).
func DecodeHeader(queue, id string, b []byte) (*broker.Message, error) {
	m, _, err := Decode(queue, id, b)
	if err == nil {
		return m, nil
	}
	m, _, herr := Decode(queue, id, headerOnly(b))
	if herr != nil {
		return nil, err
	}
	return m, nil
}

// headerOnly returns b with its body cut out (body length set to 0).
func headerOnly(b []byte) []byte {
	if len(b) < HeaderSize {
		return b
	}
	bodyLen := int(binary.BigEndian.Uint32(b[offBodyLen:]))
	if bodyLen > len(b)-HeaderSize {
		return b
	}
	out := make([]byte, 0, len(b)-bodyLen)
	out = append(out, b[:HeaderSize]...)
	binary.BigEndian.PutUint32(out[offBodyLen:], 0)
	return append(out, b[HeaderSize+bodyLen:]...)
}

func decodeBody(r *reader, m *broker.Message) error {
	m.Type = r.str()
	if p := r.bytes(); len(p) > 0 {
		m.Payload = p
	}
	n := r.uvarint()
	if n > maxHeaders {
		return fmt.Errorf("%w: %d headers", ErrCorrupt, n)
	}
	if n > 0 && r.err == nil {
		m.Headers = make(map[string]string, n)
		for i := uint64(0); i < n && r.err == nil; i++ {
			k := r.str()
			m.Headers[k] = r.str()
		}
	}
	m.EnqueuedAt = fromMS(r.varint())
	m.CompletedAt = fromMS(r.varint())
	m.Timeout = r.dur()
	m.Deadline = fromMS(r.varint())
	m.Retention = r.dur()
	m.UniqueTTL = r.dur()
	if r.err != nil {
		return fmt.Errorf("%w: body: %v", ErrCorrupt, r.err)
	}
	return nil
}

// Token reads only the token of a record; ok is false for a record too short
// to have one.
func Token(b []byte) (uint64, bool) {
	if len(b) < HeaderSize || b[0] != Version {
		return 0, false
	}
	return uint64(binary.BigEndian.Uint32(b[offToken:])), true
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

func clampU16(n int) uint16 {
	return uint16(min(max(n, 0), MaxCount))
}

// putU48 writes v (Unix ms) in 6 bytes; negative values become 0 (unset).
func putU48(b []byte, v int64) {
	if v < 0 || v >= 1<<48 {
		v = 0
	}
	for i := 5; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

func u48(b []byte) int64 {
	var v int64
	for i := range 6 {
		v = v<<8 | int64(b[i])
	}
	return v
}

// ms converts t to Unix milliseconds; the zero time is 0.
func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v)
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("truncated varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errors.New("truncated varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// dur reads a duration in ms, refusing values that overflow time.Duration.
func (r *reader) dur() time.Duration {
	v := r.uvarint()
	if v > math.MaxInt64/uint64(time.Millisecond) {
		if r.err == nil {
			r.err = fmt.Errorf("duration %dms out of range", v)
		}
		return 0
	}
	return time.Duration(v) * time.Millisecond
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("length %d exceeds remaining %d bytes", n, len(r.b))
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) str() string { return string(r.bytes()) }
