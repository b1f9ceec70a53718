package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"github.com/tidequeue/tide/tidetype"
)

// Errors of durable handlers' storage (Durable). The root package
// re-exports them.
var (
	// ErrSignalSent is returned by Signal for a signal name the task has
	// received already: the first signal of a name wins.
	ErrSignalSent = errors.New("tide: signal already sent to this task")
	// ErrSignalTimeout is returned by Signal when the task's wait for that
	// signal timed out first; tide.WaitSignal returns it to the handler
	// whose wait timed out. Exactly one of the two outcomes happens.
	ErrSignalTimeout = errors.New("tide: signal wait timed out")
	// ErrStepLimit is returned when a task's durable records would pass
	// MaxStepRecords or MaxStepBytes.
	ErrStepLimit = errors.New("tide: durable step limit reached")
)

// Bounds of what a task's durable records hold together: steps, sleeps,
// waits and the signals sent to it. The brokers enforce them (ErrStepLimit).
const (
	MaxStepRecords = 1000
	MaxStepBytes   = 16 << 20
)

// StepKind says what a StepRecord holds.
type StepKind byte

// Step kinds.
const (
	// StepResult: the result of tide.Step (Data: the encoded value).
	StepResult StepKind = 'r'
	// StepSleep: the deadline of tide.Sleep (Finished).
	StepSleep StepKind = 'z'
	// StepWait: the deadline of tide.WaitSignal (Finished).
	StepWait StepKind = 'd'
	// StepSignal: a signal's payload (Data), received at Finished.
	StepSignal StepKind = 's'
	// StepTimedOut: the wait for the signal Name timed out at Finished.
	StepTimedOut StepKind = 't'
	// StepParked: what the task waits for while parked: Name is
	// "sleep:<name>" or "signal:<name>", Finished the time it wakes. At
	// most one is kept; each park replaces it.
	StepParked StepKind = 'p'
)

// StepRecord is one record kept with a task for its durable handler.
type StepRecord struct {
	Kind     StepKind
	Name     string
	Started  time.Time
	Finished time.Time
	Data     []byte
}

// Durable is the part of Broker that keeps durable handlers' records with
// their tasks (tide.Step, tide.Sleep, tide.WaitSignal, tide.Client.Signal);
// both shipped brokers have it. Records live and die with their task:
// GetTask returns them (TaskInfo.Steps), and deleting the task, trimming
// it, or its ending without Retention removes them; a task created again
// with the same ID starts with none. A task whose handler is parked is
// settled with SettlePark.
type Durable interface {
	// LoadSteps returns the records of the leased task, in the order
	// they were stored. A lease that is no longer current gets
	// ErrLeaseLost.
	LoadSteps(ctx context.Context, lease LeaseRef) ([]StepRecord, error)
	// SaveStep stores r with the leased task unless a record of its kind
	// and name is stored already, and returns the stored one (r, or the
	// first). A lease that is no longer current gets ErrLeaseLost and
	// stores nothing; a record past the bounds gets ErrStepLimit. Running
	// it twice stores r once.
	SaveStep(ctx context.Context, lease LeaseRef, r StepRecord) (StepRecord, error)
	// ResolveWait decides the leased task's wait for signal name, whose
	// deadline is deadline: it returns the signal's record (StepSignal)
	// when one is stored. Else it stores the wait's deadline record
	// (StepWait named name, finished at deadline) when there is none, so
	// that a wait's first reach costs one call; then, when the broker's
	// clock has reached deadline, it records and returns the time-out
	// (StepTimedOut), after which Signal refuses the name; else ok is
	// false (the wait goes on) and r is the deadline record, the first
	// stored.
	ResolveWait(ctx context.Context, lease LeaseRef, name string, deadline time.Time) (r StepRecord, ok bool, err error)
	// Signal stores payload as signal name of the task, and wakes the
	// task when it is parked waiting for it. It returns ErrTaskNotFound
	// for a task that does not exist or has finished (completed,
	// archived), ErrSignalSent when the name was signalled already,
	// ErrSignalTimeout when the task's wait for it timed out, and
	// ErrStepLimit past the bounds. A request the transport sends again
	// answers like the first and stores once.
	Signal(ctx context.Context, queue, id, name string, payload []byte) error
}

// WaitSleepPrefix and WaitSignalPrefix start what a parked task waits for
// (Settlement.WaitFor, TaskInfo.WaitingFor).
const (
	WaitSleepPrefix  = "sleep:"
	WaitSignalPrefix = "signal:"
)

// EncodeSteps appends the records to dst in the stored form both shipped
// brokers use (the Redis scripts read it): per record its kind (1 byte),
// name length (2) and name, started and finished in ms (6 each), data
// length (4) and data.
func EncodeSteps(dst []byte, rs ...StepRecord) []byte {
	for _, r := range rs {
		dst = append(dst, byte(r.Kind))
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(r.Name)))
		dst = append(dst, r.Name...)
		dst = appendMs(dst, r.Started)
		dst = appendMs(dst, r.Finished)
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(r.Data)))
		dst = append(dst, r.Data...)
	}
	return dst
}

func appendMs(dst []byte, t time.Time) []byte {
	var ms uint64
	if !t.IsZero() && t.UnixMilli() > 0 {
		ms = uint64(t.UnixMilli())
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], ms)
	return append(dst, b[2:]...)
}

func readMs(b []byte) time.Time {
	ms := uint64(b[0])<<40 | uint64(b[1])<<32 | uint64(b[2])<<24 | uint64(b[3])<<16 | uint64(b[4])<<8 | uint64(b[5])
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(int64(ms))
}

// DecodeSteps reads what EncodeSteps wrote; it stops at the first record
// it cannot read.
func DecodeSteps(b []byte) []StepRecord {
	var out []StepRecord
	for len(b) >= 19 {
		nl := int(binary.BigEndian.Uint16(b[1:]))
		if len(b) < 19+nl {
			break
		}
		dl := int(binary.BigEndian.Uint32(b[15+nl:]))
		if len(b) < 19+nl+dl {
			break
		}
		out = append(out, StepRecord{
			Kind: StepKind(b[0]), Name: string(b[3 : 3+nl]),
			Started: readMs(b[3+nl:]), Finished: readMs(b[9+nl:]),
			Data: append([]byte(nil), b[19+nl:19+nl+dl]...),
		})
		b = b[19+nl+dl:]
	}
	return out
}

// StepsSize is the stored size of the records (what MaxStepBytes bounds).
func StepsSize(rs []StepRecord) int {
	n := 0
	for _, r := range rs {
		n += 19 + len(r.Name) + len(r.Data)
	}
	return n
}

// FindStep returns the record of kind k named name, if any.
func FindStep(rs []StepRecord, k StepKind, name string) (StepRecord, bool) {
	for _, r := range rs {
		if r.Kind == k && r.Name == name {
			return r, true
		}
	}
	return StepRecord{}, false
}

// StepInfos sets what TaskInfo shows of the records: Steps (see
// tidetype.StepInfo), and, for a task in StateWaiting, WaitingFor. A
// step's size is that of its data as stored: with the type name the root
// prefixes (up to a newline), which it leaves out when it can see it.
func StepInfos(t *tidetype.TaskInfo, rs []StepRecord) {
	t.Steps = nil
	for _, r := range rs {
		si := tidetype.StepInfo{Name: r.Name, StartedAt: r.Started, FinishedAt: r.Finished, ResultSize: len(r.Data)}
		switch r.Kind {
		case StepResult:
			si.State = tidetype.StepSucceeded
			if i := strings.IndexByte(string(r.Data), '\n'); i >= 0 {
				si.ResultSize = len(r.Data) - i - 1
			}
		case StepSleep:
			si.Name, si.State = "sleep:"+r.Name, tidetype.StepWaiting
		case StepWait:
			si.Name, si.State = "wait:"+r.Name, tidetype.StepWaiting
		case StepSignal:
			si.Name, si.State = "signal:"+r.Name, tidetype.StepSucceeded
		case StepTimedOut:
			si.Name, si.State, si.Err = "wait:"+r.Name, tidetype.StepFailed, ErrSignalTimeout.Error()
		case StepParked:
			if t.State == tidetype.StateWaiting {
				t.WaitingFor = r.Name
			}
			continue
		default:
			continue
		}
		t.Steps = append(t.Steps, si)
	}
}
