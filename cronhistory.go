package tide

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidequeue/tide/internal/engine"
)

// CronRun is one tick of a periodic entry and what became of its task.
type CronRun struct {
	Tick   time.Time
	TaskID string
	// Task is the tick's task as stored now; nil when it is gone (it
	// succeeded and its retention ended, or it was deleted) or was never
	// enqueued (no scheduler ran at the tick).
	Task *TaskInfo
}

// maxCronHistory bounds CronHistory's n.
const maxCronHistory = 100

// CronHistory returns the last n (1 to 100) ticks of a periodic entry (as
// SchedulerEntries lists it), newest first, each with its task: pending,
// running, retrying, archived with its error, or completed. A tick's task
// is kept for at least two intervals after it succeeds, so older ticks show
// no task.
func (in *Inspector) CronHistory(ctx context.Context, e SchedulerEntry, n int) ([]CronRun, error) {
	if n < 1 || n > maxCronHistory {
		return nil, fmt.Errorf("%w: CronHistory of %d ticks: must be 1 to %d", ErrInvalidTask, n, maxCronHistory)
	}
	loc := time.UTC
	if e.Location != "" {
		var err error
		if loc, err = time.LoadLocation(e.Location); err != nil {
			return nil, fmt.Errorf("tide: cron entry %s: time zone %q: %w", e.ID, e.Location, err)
		}
	}
	sched, _, err := parseCronSpec(e.Spec, loc)
	if err != nil {
		return nil, err
	}
	at := e.Prev
	if at.IsZero() {
		var ok bool
		if at, ok = sched.Prev(time.Now(), 366*24*time.Hour); !ok {
			return nil, nil
		}
	}
	var out []CronRun
	for len(out) < n {
		r := CronRun{Tick: at, TaskID: engine.CronTaskID(e.ID, at)}
		t, err := in.b.GetTask(ctx, e.Queue, r.TaskID)
		switch {
		case err == nil:
			r.Task = t
		case !errors.Is(err, ErrTaskNotFound):
			return nil, err
		}
		out = append(out, r)
		prev, ok := sched.Prev(at.Add(-time.Millisecond), 366*24*time.Hour)
		if !ok {
			break
		}
		at = prev
	}
	return out, nil
}
