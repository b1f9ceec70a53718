package broker

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/tidequeue/tide/tidetype"
)

// EventReader is the part of Broker that keeps a durable record of task
// lifecycle events (both shipped brokers have it): what
// tide.Inspector.Events reads. The events are written in the same atomic step as the state change
// they report, so none is lost between the two.
type EventReader interface {
	// ReadEvents delivers the events of the queues, at least once and in
	// the order they were recorded within each of the broker's streams (a
	// partition of a queue), until ctx ends; then it closes the channel,
	// once every goroutine it started has returned.
	//
	// after is where to start: "" from now (events recorded after the
	// call), EventsOldest from the oldest event still kept, or the ID of
	// an event (its resume token) to continue right after that event. With
	// a token, queues may be empty (the token's queues); otherwise they
	// must be the token's queues. A malformed token, or one of other
	// queues, is an error wrapping ErrBadEventToken; a token whose
	// following events were already dropped (they are kept for a bounded
	// length and age) is an error wrapping ErrEventGap.
	//
	// When none of the queues records events (SetEvents) the error wraps
	// ErrEventsOff.
	ReadEvents(ctx context.Context, queues []string, after string) (<-chan tidetype.TaskEvent, error)

	// SetEvents turns the recording of queue's events on or off. Recording
	// costs every state change a little (one more write per batch), so
	// queues record none until turned on, unless the broker is configured
	// otherwise. The setting is kept by the broker for every process; a
	// process may take a little while to see a change (the Redis broker:
	// at once when it is subscribed to the queue's work events, else within
	// half a minute).
	SetEvents(ctx context.Context, queue string, on bool) error
}

// EventsOldest, as the after argument of ReadEvents, starts with the oldest
// event still kept.
const EventsOldest = "0"

// Errors of ReadEvents.
var (
	// ErrBadEventToken is wrapped by the error about a resume token that is
	// malformed, altered or of other queues; the message says which.
	ErrBadEventToken = errors.New("tide: invalid event resume token")
	// ErrEventGap is wrapped by the error about a resume token whose next
	// events were already dropped: continuing would skip them.
	ErrEventGap = errors.New("tide: events after the resume token were already dropped (events are kept for a bounded length and age)")
	// ErrEventsOff is wrapped by the error of ReadEvents when none of the
	// queues records events: turn them on first (SetEvents).
	ErrEventsOff = errors.New("tide: the queues record no events; turn them on with Inspector.SetQueueEvents")
)

// EventPosition is where a reader stands in one stream of events: a
// partition of a queue. Brokers build resume tokens from the positions in
// all the streams a reading covers (EncodeEventToken).
type EventPosition struct {
	Queue string
	// Epoch and Partition name the stream within the queue (the layout
	// generation and the partition index; 0 and 0 for a broker with one
	// stream per queue).
	Epoch, Partition int
	// Ms and Seq name the last entry of the stream that was delivered,
	// wholly or in part; both zero when none was.
	Ms, Seq uint64
	// Skip, when positive, is how many events of that entry were
	// delivered: the entry is not finished. Zero means all of them.
	Skip int
}

// Bounds a decoded token must respect, so that a forged one cannot make a
// reader allocate without limit.
const (
	maxTokenQueues  = 1024
	maxTokenStreams = 4096 // per queue: current and old span of a repartition, and retired ones
	maxTokenLen     = 1 << 20
)

// tokenPrefix starts every resume token: "e" and the format's version.
const tokenPrefix = "e1"

// EncodeEventToken returns the resume token for the positions: "e1"
// followed by base64url (no padding) of the positions, sorted by queue,
// epoch and partition, and a CRC-32 of them. The token is opaque to users.
func EncodeEventToken(ps []EventPosition) string {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, comparePositions)
	var b []byte
	nq := 0
	for i := range ps {
		if i == 0 || ps[i].Queue != ps[i-1].Queue {
			nq++
		}
	}
	b = binary.AppendUvarint(b, uint64(nq))
	for i := 0; i < len(ps); {
		j := i
		for j < len(ps) && ps[j].Queue == ps[i].Queue {
			j++
		}
		b = binary.AppendUvarint(b, uint64(len(ps[i].Queue)))
		b = append(b, ps[i].Queue...)
		b = binary.AppendUvarint(b, uint64(j-i))
		for _, p := range ps[i:j] {
			b = binary.AppendUvarint(b, uint64(p.Epoch))
			b = binary.AppendUvarint(b, uint64(p.Partition))
			b = binary.AppendUvarint(b, p.Ms)
			b = binary.AppendUvarint(b, p.Seq)
			b = binary.AppendUvarint(b, uint64(p.Skip))
		}
		i = j
	}
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func comparePositions(a, b EventPosition) int {
	return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Epoch, b.Epoch), cmp.Compare(a.Partition, b.Partition))
}

// DecodeEventToken returns the positions a token holds, sorted by queue,
// epoch and partition. Every problem is an error wrapping
// ErrBadEventToken that names it.
func DecodeEventToken(tok string) ([]EventPosition, error) {
	bad := func(format string, args ...any) ([]EventPosition, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrBadEventToken}, args...)...)
	}
	switch {
	case tok == "":
		return bad("empty")
	case len(tok) > maxTokenLen:
		return bad("%d bytes long, over %d", len(tok), maxTokenLen)
	case len(tok) >= 2 && tok[0] == 'e' && tok[1] >= '0' && tok[1] <= '9' && tok[1] != '1':
		return bad("format version %c is not one this version of tide reads (1)", tok[1])
	case len(tok) < len(tokenPrefix) || tok[:len(tokenPrefix)] != tokenPrefix:
		return bad("%q does not start with %q: it is not the ID of an event", clip(tok), tokenPrefix)
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok[len(tokenPrefix):])
	if err != nil {
		return bad("not base64url after %q: %v", tokenPrefix, err)
	}
	if len(raw) < 5 {
		return bad("cut short (%d bytes)", len(raw))
	}
	body, sum := raw[:len(raw)-4], binary.BigEndian.Uint32(raw[len(raw)-4:])
	if crc32.ChecksumIEEE(body) != sum {
		return bad("checksum mismatch: the token was cut short or altered")
	}
	r := tokenReader{b: body}
	nq := r.uvarint(maxTokenQueues)
	var out []EventPosition
	for range nq {
		q := r.str()
		ns := r.uvarint(maxTokenStreams)
		if r.err == nil && (q == "" || ns == 0) {
			r.err = errors.New("a queue without name or streams")
		}
		for range ns {
			p := EventPosition{Queue: q}
			p.Epoch = int(r.uvarint(1 << 30))
			p.Partition = int(r.uvarint(1 << 30))
			p.Ms = r.uvarint(1<<64 - 1)
			p.Seq = r.uvarint(1<<64 - 1)
			p.Skip = int(r.uvarint(1 << 30))
			if r.err != nil {
				break
			}
			if p.Skip > 0 && p.Ms == 0 && p.Seq == 0 {
				r.err = fmt.Errorf("queue %q partition %d skips events of no entry", q, p.Partition)
			}
			out = append(out, p)
		}
		if r.err != nil {
			break
		}
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d bytes left over", len(r.b))
	}
	if r.err != nil {
		return bad("%v", r.err)
	}
	for i := 1; i < len(out); i++ {
		if c := comparePositions(out[i-1], out[i]); c >= 0 {
			return bad("streams out of order or repeated (queue %q)", out[i].Queue)
		}
	}
	return out, nil
}

// TokenQueues returns the queues of positions, in order, each once.
func TokenQueues(ps []EventPosition) []string {
	var qs []string
	for _, p := range ps {
		if len(qs) == 0 || qs[len(qs)-1] != p.Queue {
			qs = append(qs, p.Queue)
		}
	}
	return qs
}

// CheckTokenQueues checks that queues, when not empty, are the queues of a
// token's positions (in any order), and returns the queues to read.
func CheckTokenQueues(queues []string, ps []EventPosition) ([]string, error) {
	have := TokenQueues(ps)
	if len(queues) == 0 {
		return have, nil
	}
	want := slices.Clone(queues)
	slices.Sort(want)
	want = slices.Compact(want)
	if !slices.Equal(want, have) {
		return nil, fmt.Errorf("%w: it is for queues %q, not %q; read the same queues to resume", ErrBadEventToken, have, want)
	}
	return want, nil
}

type tokenReader struct {
	b   []byte
	err error
}

func (r *tokenReader) uvarint(limit uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("cut short")
		return 0
	}
	if v > limit {
		r.err = fmt.Errorf("a number (%d) over its bound %d", v, limit)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *tokenReader) str() string {
	n := r.uvarint(1024)
	if r.err != nil {
		return ""
	}
	if uint64(len(r.b)) < n {
		r.err = errors.New("cut short")
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func clip(s string) string {
	if len(s) > 24 {
		return s[:24] + "..."
	}
	return s
}
