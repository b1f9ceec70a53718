package tide

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidequeue/tide/tidetype"
)

// Progress is what a running task last reported (ReportProgress); see
// tidetype.Progress.
type Progress = tidetype.Progress

// ReportProgress records how far the handler's task is: percent (0 to 100)
// and a short note (at most tidetype.MaxProgressNote bytes), shown as
// TaskInfo.Progress by the Inspector, the dashboard and `tide tasks show`.
// It is a write to the broker: report at milestones, not in a tight loop.
// It returns ErrLeaseLost when the task's lease was lost (stop the work),
// an error wrapping ErrInvalidTask for a bad percent or note, and an error
// when called outside a handler or on a broker that keeps no progress.
func ReportProgress(ctx context.Context, percent int, note string) error {
	m, ok := metaFrom(ctx)
	if !ok {
		return errors.New("tide: ReportProgress called outside a task handler")
	}
	if percent < 0 || percent > 100 {
		return fmt.Errorf("%w: ReportProgress(%d): percent must be 0 to 100", ErrInvalidTask, percent)
	}
	if len(note) > tidetype.MaxProgressNote {
		return fmt.Errorf("%w: ReportProgress: note is %d bytes, over the %d limit", ErrInvalidTask, len(note), tidetype.MaxProgressNote)
	}
	pr := m.b
	return pr.SetProgress(ctx, m.lease, Progress{Percent: percent, Note: note, At: time.Now()})
}
