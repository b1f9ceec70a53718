package tide

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// BatchHandler processes several tasks of a type at once: bulk inserts,
// aggregation, one API call for many items. ProcessBatch returns one error
// per task, in order (nil for a task that succeeded); each task then settles
// on its own, retried, archived or completed like a task of an ordinary
// Handler. A slice of another length fails every task of the batch.
type BatchHandler interface {
	ProcessBatch(ctx context.Context, tasks []*Task) []error
}

// BatchHandlerFunc adapts an ordinary function to the BatchHandler interface.
type BatchHandlerFunc func(ctx context.Context, tasks []*Task) []error

// ProcessBatch calls f(ctx, tasks).
func (f BatchHandlerFunc) ProcessBatch(ctx context.Context, tasks []*Task) []error {
	return f(ctx, tasks)
}

// BatchOption configures HandleBatch.
type BatchOption func(*gatherer)

// Defaults of HandleBatch.
const (
	DefaultBatchSize = 100
	DefaultBatchWait = time.Second
)

// BatchSize sets the most tasks a batch holds (default DefaultBatchSize). A
// batch starts as soon as it is full. A server hands a batch at most as
// many tasks as it has workers (Config.Concurrency), so a size above that
// starts batches only when BatchWait runs out. BatchSize panics if n < 1.
func BatchSize(n int) BatchOption {
	if n < 1 {
		panic(fmt.Sprintf("tide: BatchSize(%d): must be at least 1", n))
	}
	return func(b *gatherer) { b.size = n }
}

// BatchWait sets how long a batch waits for more tasks after its first one
// arrived (default DefaultBatchWait). BatchWait panics if d is not positive.
func BatchWait(d time.Duration) BatchOption {
	if d <= 0 {
		panic(fmt.Sprintf("tide: BatchWait(%v): must be positive", d))
	}
	return func(b *gatherer) { b.wait = d }
}

// HandleBatch registers h for pattern (matched as Handle matches it): the
// tasks of those types that arrive within BatchWait of each other, up to
// BatchSize, are handed to h together. Each task passes the mux's
// middleware on its own, keeps its own lease (renewed while the batch
// waits and runs) and settles on its own with the error h returned for it.
// In h, Task.Context gives a task's own handler context, for GetTaskID,
// WriteResult and ReportProgress, and for durable calls: Step, Sleep and
// WaitSignal on a task's context keep that task's records, and a task
// whose Sleep or WaitSignal suspended it (h returns that error for it) is
// parked alone while the others settle; on h's own context they fail with
// ErrNotDurable. The context h gets ends when every task's
// context has ended (the server shuts down); a task cancelled meanwhile
// still gets h's result. A panic in h fails every task of the batch with
// the panic and its stack. When the server shuts down, a batch still
// waiting for tasks runs as soon as the handlers' contexts end (after
// Config.ShutdownTimeout). HandleBatch panics like Handle.
func (m *ServeMux) HandleBatch(pattern string, h BatchHandler, opts ...BatchOption) {
	if h == nil {
		panic("tide: ServeMux.HandleBatch: nil handler for " + pattern)
	}
	if f, ok := h.(BatchHandlerFunc); ok && f == nil {
		panic("tide: ServeMux.HandleBatch: nil handler for " + pattern)
	}
	b := &gatherer{h: h, size: DefaultBatchSize, wait: DefaultBatchWait}
	for _, o := range opts {
		o(b)
	}
	m.Handle(pattern, b)
}

// gatherer is the Handler HandleBatch registers: the first task of a batch
// (its leader) waits until the batch is full, BatchWait has passed or its
// own context ends, then runs the batch handler in its own goroutine; the
// others wait for the result. No goroutine is started.
type gatherer struct {
	h    BatchHandler
	size int
	wait time.Duration

	mu  sync.Mutex
	cur *batch // the batch being filled, if any
}

type batch struct {
	tasks []*Task
	full  chan struct{} // closed when the batch reached its size
	done  chan struct{} // closed when errs is set
	errs  []error
}

// ProcessTask implements Handler: it adds t to the batch being filled.
func (b *gatherer) ProcessTask(ctx context.Context, t *Task) error {
	own := *t
	own.ctx = ctx
	b.mu.Lock()
	bt := b.cur
	leader := bt == nil
	if leader {
		bt = &batch{full: make(chan struct{}), done: make(chan struct{})}
		b.cur = bt
	}
	i := len(bt.tasks)
	bt.tasks = append(bt.tasks, &own)
	if len(bt.tasks) >= b.size {
		b.cur = nil
		close(bt.full)
	}
	b.mu.Unlock()
	if !leader {
		<-bt.done
		return bt.errs[i]
	}
	timer := time.NewTimer(b.wait)
	select {
	case <-bt.full:
	case <-timer.C:
	case <-ctx.Done():
	}
	timer.Stop()
	b.mu.Lock()
	if b.cur == bt {
		b.cur = nil // no task joins from here on
	}
	tasks := bt.tasks
	b.mu.Unlock()
	bt.errs = b.run(tasks)
	close(bt.done)
	return bt.errs[i]
}

// run calls the batch handler and returns one error per task.
func (b *gatherer) run(tasks []*Task) (errs []error) {
	ctx, cancel := batchContext(tasks)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			err := fmt.Errorf("tide: batch handler panic: %v\n%s", r, debug.Stack())
			errs = make([]error, len(tasks))
			for i := range errs {
				errs[i] = err
			}
		}
	}()
	errs = b.h.ProcessBatch(ctx, tasks)
	if len(errs) != len(tasks) {
		err := fmt.Errorf("tide: batch handler returned %d errors for %d tasks", len(errs), len(tasks))
		errs = make([]error, len(tasks))
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// batchCtxKey marks a batch handler's own context: it carries the first
// task's values, but durable calls on it are refused (durableOf), as it
// stands for no single task.
type batchCtxKey struct{}

// batchContext returns a context with the values of the first task's
// context that ends when every task's context has ended.
func batchContext(tasks []*Task) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithValue(context.WithoutCancel(tasks[0].ctx), batchCtxKey{}, true))
	var mu sync.Mutex
	left := len(tasks)
	stops := make([]func() bool, len(tasks))
	for i, t := range tasks {
		stops[i] = context.AfterFunc(t.ctx, func() {
			mu.Lock()
			left--
			last := left == 0
			mu.Unlock()
			if last {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
