package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// Payload layout (payloadSize bytes): kind (1 byte), task index (8 bytes),
// reference time in Unix nanoseconds (8 bytes: the enqueue time or the due
// time), then padding.
const (
	payloadSize = 64
	kindTask    = 1
	kindWarmup  = 2
)

func makePayload(kind byte, idx int, ref time.Time) []byte {
	p := make([]byte, payloadSize)
	p[0] = kind
	binary.BigEndian.PutUint64(p[1:9], uint64(idx))
	binary.BigEndian.PutUint64(p[9:17], uint64(ref.UnixNano()))
	for i := 17; i < payloadSize; i++ {
		p[i] = 'x'
	}
	return p
}

func parsePayload(p []byte) (kind byte, idx int, ref int64, ok bool) {
	if len(p) < 17 {
		return 0, 0, 0, false
	}
	return p[0], int(binary.BigEndian.Uint64(p[1:9])), int64(binary.BigEndian.Uint64(p[9:17])), true
}

// recorder notes when the handler first started each of n tasks. It counts
// warm-up tasks, duplicate deliveries and payloads it cannot read, so that a
// run that did not process every task exactly once is caught.
type recorder struct {
	n      int
	starts []atomic.Int64 // handler start, Unix ns; 0: not yet
	refs   []atomic.Int64 // reference time from the payload, Unix ns
	got    atomic.Int64
	dups   atomic.Int64
	bad    atomic.Int64
	warm   atomic.Int64
	done   chan struct{}
}

func newRecorder(n int) *recorder {
	return &recorder{n: n, starts: make([]atomic.Int64, n), refs: make([]atomic.Int64, n), done: make(chan struct{})}
}

// handle is the handler body of most workloads; it returns at once.
func (r *recorder) handle(_ context.Context, p []byte) error {
	now := time.Now().UnixNano()
	kind, idx, ref, ok := parsePayload(p)
	switch {
	case ok && kind == kindWarmup:
		r.warm.Add(1)
		return nil
	case !ok || kind != kindTask || idx < 0 || idx >= r.n:
		r.bad.Add(1)
		return nil
	}
	if !r.starts[idx].CompareAndSwap(0, now) {
		r.dups.Add(1)
		return nil
	}
	r.refs[idx].Store(ref)
	if r.got.Add(1) == int64(r.n) {
		close(r.done)
	}
	return nil
}

// wait waits until every task has started, ctx ends or limit passes.
func (r *recorder) wait(ctx context.Context, limit time.Duration) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-r.done:
		return r.check()
	case <-ctx.Done():
		return fmt.Errorf("only %d of %d tasks started before the workload's time box ended: %w", r.got.Load(), r.n, ctx.Err())
	case <-t.C:
		return fmt.Errorf("only %d of %d tasks started within %v", r.got.Load(), r.n, limit)
	}
}

// waitWarm waits until n warm-up tasks have run.
func (r *recorder) waitWarm(ctx context.Context, n int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for r.warm.Load() < n {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("only %d of %d warm-up tasks ran within %v", r.warm.Load(), n, limit)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

func (r *recorder) check() error {
	if d, b := r.dups.Load(), r.bad.Load(); d != 0 || b != 0 {
		return fmt.Errorf("%d duplicate deliveries and %d unreadable payloads among %d tasks", d, b, r.n)
	}
	return nil
}

// delays returns start minus reference time of every task, sorted.
func (r *recorder) delays() []time.Duration {
	out := make([]time.Duration, r.n)
	for i := range out {
		out[i] = time.Duration(r.starts[i].Load() - r.refs[i].Load())
	}
	slices.Sort(out)
	return out
}

// lastStart returns the latest handler start.
func (r *recorder) lastStart() time.Time {
	var last int64
	for i := range r.starts {
		last = max(last, r.starts[i].Load())
	}
	return time.Unix(0, last)
}

// pct returns the p-th percentile (nearest rank) of sorted values.
func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	k = min(max(k, 0), len(sorted)-1)
	return sorted[k]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
