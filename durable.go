package tide

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/tidequeue/tide/broker"
)

// Errors of durable handlers.
var (
	// ErrSuspended is wrapped by the error of Sleep and WaitSignal when the
	// handler must stop for now: return it (or an error wrapping it) and
	// the server parks the task (StateWaiting) until its time comes or its
	// signal arrives, then runs it again from the top, Steps replaying
	// from storage. A handler that swallows it is parked all the same: its
	// context remembers that it asked to be suspended.
	ErrSuspended = errors.New("tide: handler suspended until its sleep ends or its signal arrives")
	// ErrSignalTimeout is returned by WaitSignal when no signal came before
	// its timeout, and by Client.Signal for a signal whose wait timed out
	// first: one outcome, never both.
	ErrSignalTimeout = broker.ErrSignalTimeout
	// ErrSignalSent is returned by Client.Signal for a name that was
	// signalled already: the first signal of a name wins.
	ErrSignalSent = broker.ErrSignalSent
	// ErrStepLimit is wrapped by the error of Step, Sleep, WaitSignal or
	// Client.Signal past the bounds of a task's durable records (MaxSteps,
	// MaxStepBytes; the broker's own bounds also count signals).
	ErrStepLimit = broker.ErrStepLimit
	// ErrNotDurable is wrapped by the error of Step, Sleep and WaitSignal
	// called with a context that is not a handler's (a batch handler's own
	// context is not: use each task's Task.Context), or a bad name,
	// duration or step type.
	ErrNotDurable = errors.New("tide: not a durable step")
)

// Bounds of durable handlers, enforced with errors wrapping ErrStepLimit
// (MaxSteps, MaxStepBytes, MaxSignalSize) or ErrNotDurable (MaxSleep).
const (
	// MaxSteps is how many steps, sleeps and signal waits one task may
	// store.
	MaxSteps = 256
	// MaxStepBytes bounds the stored results of one task's steps together
	// (JSON, plus the type name of each).
	MaxStepBytes = 4 << 20
	// MaxSignalSize bounds one signal's payload (JSON).
	MaxSignalSize = 256 << 10
	// MaxSleep is the longest Sleep and WaitSignal timeout.
	MaxSleep = 366 * 24 * time.Hour
)

// durState is what a handler's context keeps of its task's durable
// records: those the lease brought (broker.Delivery.Steps), or, from a
// broker that does not bring them, those LoadSteps returns on first use;
// then kept up to date by this attempt's own writes (only the lease holder
// writes steps). So a Step replayed costs no broker call and a Step run
// costs one: the store of its result. A signal stored after the lease was
// granted is not in them; WaitSignal asks the broker (ResolveWait) before
// it parks. It is safe for concurrent use by the handler's goroutines.
type durState struct {
	mu      sync.Mutex
	loaded  bool
	recs    []broker.StepRecord
	suspend *suspension
}

// suspension is the first park a handler asked for.
type suspension struct {
	wait  string // "sleep:<name>", "signal:<name>"
	until time.Time
}

// storeTimeout bounds a step's store when the handler's context has ended:
// a result that fn produced is worth storing while the lease holds.
const storeTimeout = 10 * time.Second

// durableOf returns the task of a handler's context with its records.
func durableOf(ctx context.Context, what, name string) (*taskMeta, []broker.StepRecord, error) {
	m, ok := metaFrom(ctx)
	if !ok || m.dur == nil {
		return nil, nil, fmt.Errorf("%w: %s %q called outside a handler", ErrNotDurable, what, name)
	}
	if ctx.Value(batchCtxKey{}) != nil {
		return nil, nil, fmt.Errorf("%w: %s %q called with a batch handler's context: use the task's own (Task.Context)", ErrNotDurable, what, name)
	}
	if name == "" || len(name) > 200 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return nil, nil, fmt.Errorf("%w: %s name %q: empty, over 200 bytes or with a control character", ErrNotDurable, what, name)
	}
	ds := m.dur
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if !ds.loaded {
		rs, err := m.b.LoadSteps(ctx, m.lease)
		if err != nil {
			return nil, nil, fmt.Errorf("tide: %s %q: load steps: %w", what, name, err)
		}
		ds.recs, ds.loaded = rs, true
	}
	return m, ds.recs, nil
}

// claim checks that name is not used by a step of another kind than k.
func claim(recs []broker.StepRecord, k broker.StepKind, what, name string) error {
	for _, r := range recs {
		if r.Name == name && r.Kind != k && (r.Kind == broker.StepResult || r.Kind == broker.StepSleep || r.Kind == broker.StepWait) {
			return fmt.Errorf("%w: %s %q: the name is used by a %s of this task", ErrNotDurable, what, name, kindName(r.Kind))
		}
	}
	return nil
}

func kindName(k broker.StepKind) string {
	switch k {
	case broker.StepSleep:
		return "Sleep"
	case broker.StepWait:
		return "WaitSignal"
	}
	return "Step"
}

// save stores r fenced by the handler's lease and keeps what was stored.
func (m *taskMeta) save(ctx context.Context, r broker.StepRecord) (broker.StepRecord, error) {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
		defer cancel()
	}
	got, err := m.b.SaveStep(ctx, m.lease, r)
	if err != nil {
		return got, err
	}
	m.dur.mu.Lock()
	if _, ok := broker.FindStep(m.dur.recs, got.Kind, got.Name); !ok {
		m.dur.recs = append(m.dur.recs, got)
	}
	m.dur.mu.Unlock()
	return got, nil
}

// stepCount returns how many steps, sleeps and waits recs hold and the
// size of their stored results.
func stepCount(recs []broker.StepRecord) (n, size int) {
	for _, r := range recs {
		switch r.Kind {
		case broker.StepResult, broker.StepSleep, broker.StepWait:
			n++
			size += len(r.Data)
		}
	}
	return n, size
}

// typeName names T in a stored step result, so that a name reused with
// another type is an error rather than a wrong value.
func typeName[T any]() string {
	return reflect.TypeFor[T]().String()
}

// Step runs fn once for the task, as the step name, and keeps its result:
// the first attempt that reaches it runs fn and stores the result (JSON)
// with the task, fenced by the attempt's lease, so that a worker that lost
// its lease stores nothing (the error wraps ErrLeaseLost). Every later
// attempt of the task (a retry, recovery after a crash, a resume after
// Sleep or WaitSignal) gets the stored result without running fn. fn runs
// at least once, and exactly once whenever its result was stored: a worker
// that dies after fn returned and before the store runs it again.
//
// An error of fn is returned as it is; returned by the handler, it fails
// the attempt under the task's retry policy, and nothing is stored. Names
// are unique per task across Step, Sleep and WaitSignal; a name reused
// with another type T, or by a Sleep or WaitSignal, is an error wrapping
// ErrNotDurable, as is a ctx that is not a handler's (in a batch handler,
// pass the task's Task.Context: the batch's own context is refused). At
// most MaxSteps steps and MaxStepBytes of results per task (ErrStepLimit).
// Step is safe for concurrent use with distinct names.
//
// Cost: a step replayed makes no broker call (the records came with the
// attempt's lease) and a step run makes one, the store of its result.
func Step[T any](ctx context.Context, name string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	m, recs, err := durableOf(ctx, "Step", name)
	if err != nil {
		return zero, err
	}
	if err := claim(recs, broker.StepResult, "Step", name); err != nil {
		return zero, err
	}
	typ := typeName[T]()
	if r, ok := broker.FindStep(recs, broker.StepResult, name); ok {
		_, end := observeStep(ctx, name, true)
		v, err := decodeStep[T](r, typ, name)
		end(err)
		return v, err
	}
	if n, _ := stepCount(recs); n >= MaxSteps {
		return zero, fmt.Errorf("%w: Step %q: the task has %d steps (MaxSteps)", ErrStepLimit, name, n)
	}
	started := m.b.Now()
	octx, end := observeStep(ctx, name, false)
	v, err := fn(octx)
	if err != nil {
		end(err)
		return zero, err
	}
	v2, err := storeStep(ctx, m, name, typ, started, v)
	end(err)
	return v2, err
}

// storeStep stores v as the result of step name and returns it as decoded
// from what was stored.
func storeStep[T any](ctx context.Context, m *taskMeta, name, typ string, started time.Time, v T) (T, error) {
	var zero T
	data, err := json.Marshal(v)
	if err != nil {
		return zero, fmt.Errorf("%w: Step %q: encode result: %v", ErrNotDurable, name, err)
	}
	m.dur.mu.Lock()
	_, size := stepCount(m.dur.recs)
	m.dur.mu.Unlock()
	stored := append([]byte(typ+"\n"), data...)
	if size+len(stored) > MaxStepBytes {
		return zero, fmt.Errorf("%w: Step %q: results would take %d bytes, over MaxStepBytes (%d)", ErrStepLimit, name, size+len(stored), MaxStepBytes)
	}
	r, err := m.save(ctx, broker.StepRecord{Kind: broker.StepResult, Name: name, Started: started, Finished: m.b.Now(), Data: stored})
	if err != nil {
		return zero, fmt.Errorf("tide: Step %q: store result: %w", name, err)
	}
	return decodeStep[T](r, typ, name)
}

func decodeStep[T any](r broker.StepRecord, typ, name string) (T, error) {
	var v T
	got, data, _ := strings.Cut(string(r.Data), "\n")
	if got != typ {
		return v, fmt.Errorf("%w: Step %q: stored as %s, asked for as %s", ErrNotDurable, name, got, typ)
	}
	if err := json.Unmarshal([]byte(data), &v); err != nil {
		return v, fmt.Errorf("%w: Step %q: decode stored result: %v", ErrNotDurable, name, err)
	}
	return v, nil
}

// suspended records that the handler asked to park (the first ask wins)
// and returns the error wrapping ErrSuspended.
func (m *taskMeta) suspended(wait string, until time.Time) error {
	m.dur.mu.Lock()
	if m.dur.suspend == nil {
		m.dur.suspend = &suspension{wait: wait, until: until}
	}
	s := m.dur.suspend
	m.dur.mu.Unlock()
	return fmt.Errorf("tide: waiting for %s until %s: %w", s.wait, s.until.UTC().Format(time.RFC3339Nano), ErrSuspended)
}

// already returns the park the handler asked for, or nil.
func (m *taskMeta) already() *suspension {
	m.dur.mu.Lock()
	defer m.dur.mu.Unlock()
	return m.dur.suspend
}

// Sleep pauses the task for d, holding no worker: on first reach it
// stores its deadline (now + d on the broker's clock) as the step name, and
// returns an error wrapping ErrSuspended that the handler returns; the
// server parks the task until the deadline, never earlier, then runs it
// again, when Sleep finds the deadline passed and returns nil. A replay
// uses the deadline stored first, whatever d is then. d must be from 0 to
// MaxSleep. An operator's run-now (Inspector.RunTask) ends the sleep.
func Sleep(ctx context.Context, name string, d time.Duration) error {
	if d < 0 || d > MaxSleep {
		return fmt.Errorf("%w: Sleep %q: %v is outside 0 to MaxSleep (%v)", ErrNotDurable, name, d, MaxSleep)
	}
	m, recs, err := durableOf(ctx, "Sleep", name)
	if err != nil {
		return err
	}
	if err := claim(recs, broker.StepSleep, "Sleep", name); err != nil {
		return err
	}
	if s := m.already(); s != nil {
		return m.suspended(s.wait, s.until)
	}
	r, ok := broker.FindStep(recs, broker.StepSleep, name)
	if !ok {
		if n, _ := stepCount(recs); n >= MaxSteps {
			return fmt.Errorf("%w: Sleep %q: the task has %d steps (MaxSteps)", ErrStepLimit, name, n)
		}
		now := m.b.Now()
		if r, err = m.save(ctx, broker.StepRecord{Kind: broker.StepSleep, Name: name, Started: now, Finished: now.Add(d)}); err != nil {
			return fmt.Errorf("tide: Sleep %q: store deadline: %w", name, err)
		}
	}
	if !m.b.Now().Before(r.Finished) {
		return nil
	}
	return m.suspended(broker.WaitSleepPrefix+name, r.Finished)
}

// WaitSignal waits, holding no worker, for the signal name sent to the
// task with Client.Signal, at most timeout from its first reach (the
// deadline is stored, so that a replay keeps it), and returns its payload
// decoded from JSON into T. A signal sent before the handler reaches
// WaitSignal is kept and returned at once. While none is there it returns
// an error wrapping ErrSuspended that the handler returns: the server
// parks the task until the signal arrives (it runs again at once) or the
// deadline comes, when WaitSignal returns ErrSignalTimeout. A signal and
// the deadline are decided in one step of the broker: exactly one of them
// wins, and Client.Signal tells the sender which. timeout must be from 0
// to MaxSleep. An operator's run-now ends the wait as timed out.
func WaitSignal[T any](ctx context.Context, name string, timeout time.Duration) (T, error) {
	var zero T
	if timeout < 0 || timeout > MaxSleep {
		return zero, fmt.Errorf("%w: WaitSignal %q: %v is outside 0 to MaxSleep (%v)", ErrNotDurable, name, timeout, MaxSleep)
	}
	m, recs, err := durableOf(ctx, "WaitSignal", name)
	if err != nil {
		return zero, err
	}
	if err := claim(recs, broker.StepWait, "WaitSignal", name); err != nil {
		return zero, err
	}
	if s := m.already(); s != nil {
		return zero, m.suspended(s.wait, s.until)
	}
	if r, ok := broker.FindStep(recs, broker.StepSignal, name); ok {
		return decodeSignal[T](r, name)
	}
	if _, ok := broker.FindStep(recs, broker.StepTimedOut, name); ok {
		return zero, fmt.Errorf("tide: WaitSignal %q: %w", name, ErrSignalTimeout)
	}
	d, stored := broker.FindStep(recs, broker.StepWait, name)
	if !stored {
		if n, _ := stepCount(recs); n >= MaxSteps {
			return zero, fmt.Errorf("%w: WaitSignal %q: the task has %d steps (MaxSteps)", ErrStepLimit, name, n)
		}
		now := m.b.Now()
		d = broker.StepRecord{Kind: broker.StepWait, Name: name, Started: now, Finished: now.Add(timeout)}
	}
	// On first reach ResolveWait also stores the deadline: one call.
	r, ok, err := m.b.ResolveWait(ctx, m.lease, name, d.Finished)
	if err != nil {
		return zero, fmt.Errorf("tide: WaitSignal %q: %w", name, err)
	}
	if !ok {
		if !stored {
			if r.Kind == broker.StepWait && r.Name == name {
				d = r
				m.dur.mu.Lock()
				m.dur.recs = append(m.dur.recs, r)
				m.dur.mu.Unlock()
			} else if d, err = m.save(ctx, d); err != nil {
				// A broker that does not store the deadline itself.
				return zero, fmt.Errorf("tide: WaitSignal %q: store deadline: %w", name, err)
			}
		}
		return zero, m.suspended(broker.WaitSignalPrefix+name, d.Finished)
	}
	m.dur.mu.Lock()
	m.dur.recs = append(m.dur.recs, r)
	m.dur.mu.Unlock()
	if r.Kind == broker.StepTimedOut {
		return zero, fmt.Errorf("tide: WaitSignal %q: %w", name, ErrSignalTimeout)
	}
	return decodeSignal[T](r, name)
}

func decodeSignal[T any](r broker.StepRecord, name string) (T, error) {
	var v T
	if len(r.Data) == 0 {
		return v, nil
	}
	if err := json.Unmarshal(r.Data, &v); err != nil {
		return v, fmt.Errorf("%w: WaitSignal %q: decode payload: %v", ErrNotDurable, name, err)
	}
	return v, nil
}

// Signal sends the signal name, with payload encoded as JSON (a
// json.RawMessage is sent as it is; nil as null), to task taskID of
// queue: a durable handler's WaitSignal of that name returns it. The
// signal is stored with the task at once: one sent before the handler
// waits is kept for it, and a task parked waiting for it runs again at
// once. The first signal of a name wins; a second gets ErrSignalSent. A
// signal whose wait timed out first gets ErrSignalTimeout; one to a task
// that does not exist or has finished gets ErrTaskNotFound. A payload over
// MaxSignalSize is refused (ErrStepLimit). Safe to retry: a request the
// transport sends again is delivered once. It is safe for concurrent use.
func (c *Client) Signal(ctx context.Context, queue, taskID, name string, payload any) error {
	if c.closed.Load() {
		return ErrClientClosed
	}
	if err := checkQueueAndID(queue, taskID); err != nil {
		return err
	}
	if err := validateName("signal name", name); err != nil {
		return err
	}
	if len(name) > 200 {
		return fmt.Errorf("%w: signal name is %d bytes, over 200", ErrInvalidTask, len(name))
	}
	data, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("%w: signal %q: encode payload: %v", ErrInvalidTask, name, err)
	}
	if len(data) > MaxSignalSize {
		return fmt.Errorf("%w: signal %q: payload is %d bytes, over MaxSignalSize (%d)", ErrStepLimit, name, len(data), MaxSignalSize)
	}
	return c.b.Signal(ctx, queue, taskID, name, data)
}
