package encrypt

import (
	"context"
	"strings"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// The root package, the engine and the dashboard find a broker's optional
// parts by type assertion (b.(broker.Admin), ...). So that an assertion on
// the wrapper succeeds exactly when it would on the wrapped broker, Wrap
// returns one of sixteen types: the wrapper plus the parts the wrapped broker
// has. Admin is wrapped (ListTasks returns tasks, which are decrypted); the
// other parts carry no task data and are the wrapped broker's own. Every
// returned type is a broker.Waiter (tasks come back decrypted), a
// broker.ProgressReporter and a broker.EventReader (events pass through),
// which fail when the wrapped broker is not.

// adminWrapper is the broker.Admin part. It embeds the wrapped Admin, so
// every operator command passes through unchanged, and overrides the two
// methods that return tasks, which come back decrypted as GetTask returns
// them.
type adminWrapper struct {
	broker.Admin
	kr *keyring
}

// ListTasks implements broker.Admin: the tasks come back decrypted.
func (a *adminWrapper) ListTasks(ctx context.Context, queue string, state tidetype.TaskState, offset, limit int) ([]*tidetype.TaskInfo, error) {
	ts, err := a.Admin.ListTasks(ctx, queue, state, offset, limit)
	a.open(ts)
	return ts, err
}

// SearchTasks implements broker.Admin: the tasks come back decrypted. The
// stored payloads are sealed, so a payload filter is applied here, after
// opening, and a page may hold fewer than limit tasks with a next offset
// (which SearchTasks allows).
func (a *adminWrapper) SearchTasks(ctx context.Context, queue string, state tidetype.TaskState, f tidetype.TaskFilter, offset, limit int) ([]*tidetype.TaskInfo, int, error) {
	payload := f.Payload
	f.Payload = ""
	ts, next, err := a.Admin.SearchTasks(ctx, queue, state, f, offset, limit)
	a.open(ts)
	if payload != "" {
		kept := ts[:0]
		for _, t := range ts {
			if t != nil && strings.Contains(string(t.Payload), payload) {
				kept = append(kept, t)
			}
		}
		ts = kept
	}
	return ts, next, err
}

func (a *adminWrapper) open(ts []*tidetype.TaskInfo) {
	for _, t := range ts {
		if t != nil {
			a.kr.openTask(t)
		}
	}
}

// The fifteen combinations beyond the bare wrapper, named by the parts they
// add: A Admin, R Registry, C Clock, P Repartitioner.
type (
	withA struct {
		*wrapper
		*adminWrapper
	}
	withR struct {
		*wrapper
		broker.Registry
	}
	withC struct {
		*wrapper
		broker.Clock
	}
	withP struct {
		*wrapper
		broker.Repartitioner
	}
	withAR struct {
		*wrapper
		*adminWrapper
		broker.Registry
	}
	withAC struct {
		*wrapper
		*adminWrapper
		broker.Clock
	}
	withAP struct {
		*wrapper
		*adminWrapper
		broker.Repartitioner
	}
	withRC struct {
		*wrapper
		broker.Registry
		broker.Clock
	}
	withRP struct {
		*wrapper
		broker.Registry
		broker.Repartitioner
	}
	withCP struct {
		*wrapper
		broker.Clock
		broker.Repartitioner
	}
	withARC struct {
		*wrapper
		*adminWrapper
		broker.Registry
		broker.Clock
	}
	withARP struct {
		*wrapper
		*adminWrapper
		broker.Registry
		broker.Repartitioner
	}
	withACP struct {
		*wrapper
		*adminWrapper
		broker.Clock
		broker.Repartitioner
	}
	withRCP struct {
		*wrapper
		broker.Registry
		broker.Clock
		broker.Repartitioner
	}
	withARCP struct {
		*wrapper
		*adminWrapper
		broker.Registry
		broker.Clock
		broker.Repartitioner
	}
)

// compose returns w with the optional parts its broker has.
func compose(w *wrapper) broker.Broker {
	const hasA, hasR, hasC, hasP = 1, 2, 4, 8
	var (
		mask int
		a    *adminWrapper
	)
	if x, ok := w.b.(broker.Admin); ok {
		a, mask = &adminWrapper{Admin: x, kr: w.kr}, mask|hasA
	}
	r, ok := w.b.(broker.Registry)
	if ok {
		mask |= hasR
	}
	c, ok := w.b.(broker.Clock)
	if ok {
		mask |= hasC
	}
	p, ok := w.b.(broker.Repartitioner)
	if ok {
		mask |= hasP
	}
	switch mask {
	case hasA:
		return withA{w, a}
	case hasR:
		return withR{w, r}
	case hasC:
		return withC{w, c}
	case hasP:
		return withP{w, p}
	case hasA | hasR:
		return withAR{w, a, r}
	case hasA | hasC:
		return withAC{w, a, c}
	case hasA | hasP:
		return withAP{w, a, p}
	case hasR | hasC:
		return withRC{w, r, c}
	case hasR | hasP:
		return withRP{w, r, p}
	case hasC | hasP:
		return withCP{w, c, p}
	case hasA | hasR | hasC:
		return withARC{w, a, r, c}
	case hasA | hasR | hasP:
		return withARP{w, a, r, p}
	case hasA | hasC | hasP:
		return withACP{w, a, c, p}
	case hasR | hasC | hasP:
		return withRCP{w, r, c, p}
	case hasA | hasR | hasC | hasP:
		return withARCP{w, a, r, c, p}
	}
	return w
}
