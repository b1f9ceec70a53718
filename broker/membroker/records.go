package membroker

import (
	"bytes"
	"maps"
	"time"

	"github.com/tidequeue/tide/tidetype"
)

// Copies: the broker hands out and keeps its own copies of task records.

// normalize returns a deep copy of m with times and durations truncated to
// milliseconds.
func normalize(m *tidetype.TaskInfo) tidetype.TaskInfo {
	c := *clone(m)
	c.NextProcessAt = msTime(c.NextProcessAt)
	c.EnqueuedAt = msTime(c.EnqueuedAt)
	c.LastFailedAt = msTime(c.LastFailedAt)
	c.CompletedAt = msTime(c.CompletedAt)
	c.Deadline = msTime(c.Deadline)
	c.Timeout = c.Timeout.Truncate(time.Millisecond)
	c.Retention = c.Retention.Truncate(time.Millisecond)
	c.UniqueTTL = c.UniqueTTL.Truncate(time.Millisecond)
	return c
}

// clone returns a deep copy of m.
func clone(m *tidetype.TaskInfo) *tidetype.TaskInfo {
	c := *m
	c.Payload = bytes.Clone(m.Payload)
	c.Headers = maps.Clone(m.Headers)
	c.Result = bytes.Clone(m.Result)
	return &c
}

// msTime truncates t to Unix milliseconds, dropping its monotonic reading and
// location; the zero time stays zero.
func msTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return time.UnixMilli(t.UnixMilli())
}

// ---- heap ----

// taskHeap is a min-heap of tasks by key, then by insertion order.
type taskHeap []*task

func (h taskHeap) Len() int { return len(h) }
func (h taskHeap) Less(i, j int) bool {
	if h[i].key.Equal(h[j].key) {
		return h[i].seq < h[j].seq
	}
	return h[i].key.Before(h[j].key)
}
func (h taskHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}
func (h *taskHeap) Push(x any) {
	t := x.(*task)
	t.idx = len(*h)
	*h = append(*h, t)
}
func (h *taskHeap) Pop() any {
	old := *h
	n := len(old)
	t := old[n-1]
	old[n-1] = nil
	t.idx = -1
	*h = old[:n-1]
	return t
}
