package encrypt

import (
	"context"
	"strings"

	"github.com/tidequeue/tide/tidetype"
)

// The operator's views of tasks (broker.Admin) come back decrypted, as
// GetTask returns them; every other operator command passes through.

// ListTasks implements broker.Admin: the tasks come back decrypted.
func (w *wrapper) ListTasks(ctx context.Context, queue string, state tidetype.TaskState, offset, limit int) ([]*tidetype.TaskInfo, error) {
	ts, err := w.b.ListTasks(ctx, queue, state, offset, limit)
	w.open(ts)
	return ts, err
}

// SearchTasks implements broker.Admin: the tasks come back decrypted. The
// stored payloads are sealed, so a payload filter is applied here, after
// opening, and a page may hold fewer than limit tasks with a next offset
// (which SearchTasks allows).
func (w *wrapper) SearchTasks(ctx context.Context, queue string, state tidetype.TaskState, f tidetype.TaskFilter, offset, limit int) ([]*tidetype.TaskInfo, int, error) {
	payload := f.Payload
	f.Payload = ""
	ts, next, err := w.b.SearchTasks(ctx, queue, state, f, offset, limit)
	w.open(ts)
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

func (w *wrapper) open(ts []*tidetype.TaskInfo) {
	for _, t := range ts {
		if t != nil {
			w.kr.openTask(t)
		}
	}
}
