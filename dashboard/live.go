package dashboard

import (
	"context"
	"net/http"
	"time"

	"github.com/tidequeue/tide"
)

// liveSpan is how far back the live view looks.
const liveSpan = time.Hour

// liveData is the answer of GET /api/live: a queue's (or, without q, every
// queue's) activity minute by minute over the last hour and its current
// sizes. The page's script polls it and redraws the live view.
type liveData struct {
	Queue  string      `json:"queue,omitempty"`
	Now    time.Time   `json:"now"`
	Points []livePoint `json:"points"` // oldest first, one per minute
	// Sizes are the current task counts by state, and today's counters.
	Sizes liveSizes `json:"sizes"`
	// ProcessedLastHour and FailedLastHour sum the points.
	ProcessedLastHour int `json:"processed_last_hour"`
	FailedLastHour    int `json:"failed_last_hour"`
	// ProcessedPerSec and FailedPerSec are the rates over the last
	// complete minute and the current one so far.
	ProcessedPerSec float64 `json:"processed_per_sec"`
	FailedPerSec    float64 `json:"failed_per_sec"`
	Queues          int     `json:"queues"`
	// Limits and Groups (the groupsShown largest backlogs) are those of
	// the named queue; absent for every queue, or when the broker keeps
	// neither.
	Limits *tide.QueueLimits `json:"limits,omitempty"`
	Groups *[]groupJSON      `json:"groups,omitempty"`
}

type livePoint struct {
	At        int64 `json:"t"` // the minute's start, Unix milliseconds
	Processed int   `json:"processed"`
	Failed    int   `json:"failed"`
	Pending   int   `json:"pending"` // -1: not sampled
}

type liveSizes struct {
	Size      int `json:"size"`
	Pending   int `json:"pending"`
	Active    int `json:"active"`
	Scheduled int `json:"scheduled"`
	Retry     int `json:"retry"`
	Archived  int `json:"archived"`
	Completed int `json:"completed"`
	Processed int `json:"processed"` // today (UTC)
	Failed    int `json:"failed"`    // today (UTC)
	Overdue   int `json:"overdue"`
}

func (s *liveSizes) add(qi *tide.QueueInfo) {
	s.Size += qi.Size
	s.Pending += qi.Pending
	s.Active += qi.Active
	s.Scheduled += qi.Scheduled
	s.Retry += qi.Retry
	s.Archived += qi.Archived
	s.Completed += qi.Completed
	s.Processed += qi.Processed
	s.Failed += qi.Failed
	s.Overdue += qi.Overdue
}

// liveAPI handles GET /api/live?q=Q. Errors are JSON too:
// {"ok":false,"error":...} with the status of the error page.
func (h *handler) liveAPI(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	d, err := h.live(ctx, r.URL.Query().Get("q"), r.URL.Query().Has("q"))
	if err != nil {
		status, heading := classify(err, false)
		if status >= 500 {
			h.log.Error("tide dashboard: broker error", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		writeJSON(w, status, map[string]any{"ok": false, "error": heading + ": " + err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// live gathers the live view of queue, or of every queue (up to maxQueues)
// when one is not named.
func (h *handler) live(ctx context.Context, queue string, named bool) (*liveData, error) {
	now := h.now()
	since := now.Add(-liveSpan)
	var names []string
	if named {
		if err := tide.ValidateQueueName(queue); err != nil {
			return nil, err
		}
		names = []string{queue}
	} else {
		var err error
		if names, err = h.in.Queues(ctx); err != nil {
			return nil, err
		}
		names = names[:min(len(names), maxQueues)]
	}
	infos := make([]*tide.QueueInfo, len(names))
	series := make([][]tide.Point, len(names))
	errs := make([]error, len(names))
	parallel(len(names), 8, func(i int) {
		if infos[i], errs[i] = h.in.QueueInfo(ctx, names[i]); errs[i] != nil {
			return
		}
		series[i], errs[i] = h.in.Series(ctx, names[i], since)
	})
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	d := &liveData{Queue: queue, Now: now.UTC().Truncate(time.Millisecond), Queues: len(names)}
	for _, qi := range infos {
		d.Sizes.add(qi)
	}
	d.Points = mergeSeries(series, since, now)
	for _, p := range d.Points {
		d.ProcessedLastHour += p.Processed
		d.FailedLastHour += p.Failed
	}
	d.ProcessedPerSec, d.FailedPerSec = recentRates(d.Points, now)
	if named {
		f, err := h.flow(ctx, queue)
		if err != nil {
			return nil, err
		}
		if f != nil {
			gs := toGroupsJSON(f.Groups, now)
			d.Limits, d.Groups = &f.Limits, &gs
		}
	}

	return d, nil
}

// mergeSeries sums per-queue series by minute into one point per minute
// from since to now. A pending count is -1 when no queue sampled it.
func mergeSeries(ss [][]tide.Point, since, now time.Time) []livePoint {
	first, last := since.Unix()/60, now.Unix()/60
	if last < first {
		return nil
	}
	out := make([]livePoint, last-first+1)
	for i := range out {
		out[i] = livePoint{At: (first + int64(i)) * 60_000, Pending: -1}
	}
	for _, s := range ss {
		for _, p := range s {
			m := p.At.Unix() / 60
			if m < first || m > last {
				continue
			}
			o := &out[m-first]
			o.Processed += p.Processed
			o.Failed += p.Failed
			if p.Pending >= 0 {
				o.Pending = max(o.Pending, 0) + p.Pending
			}
		}
	}
	return out
}

// recentRates returns the processed and failed tasks per second over the
// last complete minute and the current minute so far (the last two points),
// so that the rates neither lag a minute behind nor jump at each minute's
// start.
func recentRates(ps []livePoint, now time.Time) (processed, failed float64) {
	if len(ps) == 0 {
		return 0, 0
	}
	cur := ps[len(ps)-1]
	secs := float64(now.UnixMilli()-cur.At) / 1000
	secs = min(max(secs, 0), 60)
	p, f := cur.Processed, cur.Failed
	if len(ps) >= 2 {
		prev := ps[len(ps)-2]
		p, f = p+prev.Processed, f+prev.Failed
		secs += 60
	}
	secs = max(secs, 1)
	return float64(p) / secs, float64(f) / secs
}
