// Package codec encodes tasks into the compact binary record the Redis broker
// stores as one hash field per task.
//
// A record is a fixed 24-byte header followed by three variable sections:
//
//	off len field
//	0   1   version (2)
//	1   1   state (tidetype.TaskState) in the low 3 bits; bit 7 is set when
//	        the task's cancellation was requested while it was active, bit 6
//	        while a repartition moves it, bit 5 when it is a step of a flow
//	        (broker.FlowHeader), bit 4 when the broker itself stored the task
//	        (a follow-up, broker.Delivery.Internal: only the scripts set it,
//	        Encode never does), bit 3 when someone follows the task's end
//	        (broker.Followed: its follow-up reference is kept beside it)
//	2   8   token: the fencing token of the current (or last) lease, 0 before
//	        the first delivery; drawn from a per-partition sequence that
//	        never repeats, so a re-created task ID never reuses a token
//	10  2   retried
//	12  2   max retry
//	14  6   process-at, Unix ms (0 = unset)
//	20  3   body length B
//	23  1   unique-key length U
//	24  B   body (Go only, see below)
//	24+B U  unique key
//	..  *   failure: empty, or last-failed-at (6 bytes, Unix ms) then the last error
//
// Integers are big-endian and unsigned; 48 bits of milliseconds reach the
// year 10889, and times before 1970 are stored as unset. The header has fixed
// offsets so the Lua scripts can read and patch state, token, retried and due
// time, replace the failure and find the unique key without understanding the
// body. A task that never failed spends nothing on its failure.
//
// The body holds, in order: type and payload (length-prefixed), a flags byte,
// then enqueued-at (varint Unix ms) and, only when its flag is set, headers
// (count then key/value pairs), completed-at, timeout, deadline, retention and
// unique TTL (varints; times in Unix ms, durations in ms) and the group
// (length-prefixed). Enqueued-at is
// absolute: the scripts patch process-at in place, so nothing may be stored
// relative to it.
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
	"github.com/tidequeue/tide/tidetype"
)

// Header layout; keep in sync with the Lua scripts.
const (
	Version    = 2
	HeaderSize = 24

	offState     = 1
	offToken     = 2
	offRetried   = 10
	offMaxRetry  = 12
	offProcessAt = 14
	offBodyLen   = 20
	offUniqLen   = 23

	stateMask    = 0x07
	flagFollowed = 0x08
	flagInternal = 0x10
	flagFlow     = 0x20
	flagMoving   = 0x40
	flagCancel   = 0x80

	// MaxBody is the largest body a record holds (24-bit length).
	MaxBody = 1<<24 - 1
	// MaxUniqueKey is the longest unique key a record holds.
	MaxUniqueKey = 255

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

// Flags of the optional body fields.
const (
	hasHeaders = 1 << iota
	hasCompleted
	hasTimeout
	hasDeadline
	hasRetention
	hasUniqueTTL
	hasGroup
)

// Encode returns the record for m with the given token. A unique key longer
// than MaxUniqueKey or a body over MaxBody is cut; brokers validate
// messages before encoding them.
func Encode(m *tidetype.TaskInfo, token uint64) []byte {
	uniq := m.UniqueKey
	if len(uniq) > MaxUniqueKey {
		uniq = uniq[:MaxUniqueKey]
	}
	failed := m.LastErr != "" || !m.LastFailedAt.IsZero()
	size := HeaderSize + 24 + len(m.Type) + len(m.Payload) + len(uniq)
	if failed {
		size += 6 + len(m.LastErr)
	}
	// The body is written in place after the header, which is filled in
	// last: one allocation a record (two with headers, whose size is not
	// counted ahead).
	out := make([]byte, HeaderSize, size)
	body := appendString(out, m.Type)
	body = appendBytes(body, m.Payload)
	var flags byte
	if len(m.Headers) > 0 {
		flags |= hasHeaders
	}
	if !m.CompletedAt.IsZero() {
		flags |= hasCompleted
	}
	if m.Timeout > 0 {
		flags |= hasTimeout
	}
	if !m.Deadline.IsZero() {
		flags |= hasDeadline
	}
	if m.Retention > 0 {
		flags |= hasRetention
	}
	if m.UniqueTTL > 0 {
		flags |= hasUniqueTTL
	}
	if m.Group != "" {
		flags |= hasGroup
	}
	body = append(body, flags)
	body = binary.AppendVarint(body, ms(m.EnqueuedAt))
	if flags&hasHeaders != 0 {
		body = binary.AppendUvarint(body, uint64(len(m.Headers)))
		for k, v := range m.Headers {
			body = appendString(body, k)
			body = appendString(body, v)
		}
	}
	if flags&hasCompleted != 0 {
		body = binary.AppendVarint(body, ms(m.CompletedAt))
	}
	if flags&hasTimeout != 0 {
		body = binary.AppendUvarint(body, uint64(m.Timeout/time.Millisecond))
	}
	if flags&hasDeadline != 0 {
		body = binary.AppendVarint(body, ms(m.Deadline))
	}
	if flags&hasRetention != 0 {
		body = binary.AppendUvarint(body, uint64(m.Retention/time.Millisecond))
	}
	if flags&hasUniqueTTL != 0 {
		body = binary.AppendUvarint(body, uint64(m.UniqueTTL/time.Millisecond))
	}
	if flags&hasGroup != 0 {
		body = appendString(body, m.Group)
	}
	if len(body) > HeaderSize+MaxBody {
		body = body[:HeaderSize+MaxBody]
	}
	out, body = body, body[HeaderSize:]
	out[0] = Version
	out[offState] = byte(m.State)
	if m.Headers[broker.FlowHeader] != "" {
		out[offState] |= flagFlow
	}
	if broker.Followed(m.Headers) {
		out[offState] |= flagFollowed
	}
	binary.BigEndian.PutUint64(out[offToken:], token)
	binary.BigEndian.PutUint16(out[offRetried:], clampU16(m.Retried))
	binary.BigEndian.PutUint16(out[offMaxRetry:], clampU16(m.MaxRetry))
	putU48(out[offProcessAt:], ms(m.NextProcessAt))
	out[offBodyLen], out[offBodyLen+1], out[offBodyLen+2] = byte(len(body)>>16), byte(len(body)>>8), byte(len(body))
	out[offUniqLen] = byte(len(uniq))
	out = append(out, uniq...)
	if failed {
		var at [6]byte
		putU48(at[:], ms(m.LastFailedAt))
		out = append(out, at[:]...)
		out = append(out, m.LastErr...)
	}
	return out
}

// Decode parses a record. queue and id are filled in from where the record
// was found. It returns the message and its token; any malformation is
// reported as an error wrapping ErrCorrupt, never a panic.
func Decode(queue, id string, b []byte) (*tidetype.TaskInfo, uint64, error) {
	m, token, body, err := decodeHeader(queue, id, b)
	if err != nil {
		return nil, 0, err
	}
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

// decodeHeader parses everything but the body, which it returns.
func decodeHeader(queue, id string, b []byte) (*tidetype.TaskInfo, uint64, []byte, error) {
	if len(b) < HeaderSize {
		return nil, 0, nil, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrCorrupt, len(b), HeaderSize)
	}
	if b[0] != Version {
		return nil, 0, nil, fmt.Errorf("%w: unknown version %d", ErrCorrupt, b[0])
	}
	st := tidetype.TaskState(b[offState] & stateMask)
	if !st.Valid() {
		return nil, 0, nil, fmt.Errorf("%w: unknown state %d", ErrCorrupt, b[offState])
	}
	bodyLen := int(b[offBodyLen])<<16 | int(b[offBodyLen+1])<<8 | int(b[offBodyLen+2])
	uniqLen := int(b[offUniqLen])
	if bodyLen > len(b)-HeaderSize || uniqLen > len(b)-HeaderSize-bodyLen {
		return nil, 0, nil, fmt.Errorf("%w: section lengths %d+%d exceed record size %d", ErrCorrupt, bodyLen, uniqLen, len(b))
	}
	m := &tidetype.TaskInfo{
		ID:            id,
		Queue:         queue,
		State:         st,
		Retried:       int(binary.BigEndian.Uint16(b[offRetried:])),
		MaxRetry:      int(binary.BigEndian.Uint16(b[offMaxRetry:])),
		NextProcessAt: fromMS(u48(b[offProcessAt:])),
	}
	token := binary.BigEndian.Uint64(b[offToken:])
	body := b[HeaderSize : HeaderSize+bodyLen]
	m.UniqueKey = string(b[HeaderSize+bodyLen : HeaderSize+bodyLen+uniqLen])
	switch tail := b[HeaderSize+bodyLen+uniqLen:]; {
	case len(tail) == 0:
	case len(tail) < 6:
		return nil, 0, nil, fmt.Errorf("%w: failure section of %d bytes", ErrCorrupt, len(tail))
	default:
		m.LastFailedAt = fromMS(u48(tail))
		m.LastErr = string(tail[6:])
	}
	return m, token, body, nil
}

// DecodeHeader parses only the header, unique key and failure of a record:
// what is left to show of a record whose body is corrupt (the scripts
// archive such records, and an operator still needs to see them).
func DecodeHeader(queue, id string, b []byte) (*tidetype.TaskInfo, error) {
	m, _, err := Decode(queue, id, b)
	if err == nil {
		return m, nil
	}
	m, _, _, herr := decodeHeader(queue, id, b)
	if herr != nil {
		return nil, err
	}
	return m, nil
}

func decodeBody(r *reader, m *tidetype.TaskInfo) error {
	m.Type = r.str()
	if p := r.bytes(); len(p) > 0 {
		m.Payload = p
	}
	flags := r.byte()
	if flags&^(hasHeaders|hasCompleted|hasTimeout|hasDeadline|hasRetention|hasUniqueTTL|hasGroup) != 0 && r.err == nil {
		r.err = fmt.Errorf("unknown flags %#x", flags)
	}
	m.EnqueuedAt = fromMS(r.varint())
	if flags&hasHeaders != 0 {
		n := r.uvarint()
		if n > maxHeaders {
			return fmt.Errorf("%w: %d headers", ErrCorrupt, n)
		}
		if r.err == nil {
			m.Headers = make(map[string]string, n)
			for i := uint64(0); i < n && r.err == nil; i++ {
				k := r.str()
				m.Headers[k] = r.str()
			}
		}
	}
	if flags&hasCompleted != 0 {
		m.CompletedAt = fromMS(r.varint())
	}
	if flags&hasTimeout != 0 {
		m.Timeout = r.dur()
	}
	if flags&hasDeadline != 0 {
		m.Deadline = fromMS(r.varint())
	}
	if flags&hasRetention != 0 {
		m.Retention = r.dur()
	}
	if flags&hasUniqueTTL != 0 {
		m.UniqueTTL = r.dur()
	}
	if flags&hasGroup != 0 {
		m.Group = r.str()
	}
	if r.err != nil {
		return fmt.Errorf("%w: body: %v", ErrCorrupt, r.err)
	}
	return nil
}

// Internal reports whether the record was stored by the broker itself with a
// settlement (the settle script sets the flag; Encode never does).
func Internal(b []byte) bool {
	return len(b) >= HeaderSize && b[0] == Version && b[offState]&flagInternal != 0
}

// Moving reports whether a repartition is moving the record out of its
// partition (move.lua sets the flag; Encode never does).
func Moving(b []byte) bool {
	return len(b) >= HeaderSize && b[0] == Version && b[offState]&flagMoving != 0
}

// Token reads only the token of a record; ok is false for a record too short
// to have one.
func Token(b []byte) (uint64, bool) {
	if len(b) < HeaderSize || b[0] != Version {
		return 0, false
	}
	return binary.BigEndian.Uint64(b[offToken:]), true
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

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.err = errors.New("truncated flags")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// DecodeAttempts parses an attempt history (the entries hist_add in lib.lua
// writes): started ms (6 bytes), ended ms (6), outcome (1), server length
// (1) and server, error length (2) and error. A malformed tail is ignored.
func DecodeAttempts(b []byte) []tidetype.Attempt {
	var out []tidetype.Attempt
	for len(b) >= 16 {
		sl := int(b[13])
		if len(b) < 16+sl {
			break
		}
		el := int(binary.BigEndian.Uint16(b[14+sl:]))
		if len(b) < 16+sl+el {
			break
		}
		a := tidetype.Attempt{
			Started: fromMS(u48(b[0:])),
			Ended:   fromMS(u48(b[6:])),
			Server:  string(b[14 : 14+sl]),
			Err:     string(b[16+sl : 16+sl+el]),
		}
		switch b[12] {
		case 'r':
			a.Outcome = "retry"
		case 'a':
			a.Outcome = "archive"
		case 'd':
			a.Outcome = "done"
		case 'l':
			a.Outcome = "lease expired"
		case 'w':
			a.Outcome = "deferred"
		default:
			a.Outcome = "unknown"
		}
		out = append(out, a)
		b = b[16+sl+el:]
	}
	return out
}
