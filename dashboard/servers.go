package dashboard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidequeue/tide"
)

// serversData is the data of the servers page.
type serversData struct {
	Servers    []serverRow
	Schedulers []schedRow
	MoreSched  int
	Store      *storeFacts // nil when the broker does not tell
	StoreErr   string
}

type serverRow struct {
	tide.ServerInfo
	QueueList  string
	Shown      []tide.ActiveTask
	MoreActive int
}

// schedRow is a periodic entry with its latest runs.
type schedRow struct {
	tide.SchedulerEntry
	Runs    []cronRun
	RunsErr string
}

// cronRun is one tick of a periodic entry, ready for display.
type cronRun struct {
	Tick    time.Time
	TaskID  string
	Outcome string // "succeeded", "failed", "running", "waiting", "retrying", "no task"
	Err     string
	Exists  bool
	// On the entry's own page: the task's retries and when it finished.
	Retried, MaxRetry int
	Finished          time.Time
}

// storeFacts is the Redis panel of the servers page.
type storeFacts struct {
	*tide.StoreInfo
	Used, Max string
	Percent   string // of the limit; "" without one
	// Evicting is set for an eviction policy other than noeviction: Redis
	// may then drop tasks when memory runs out.
	Evicting bool
}

// maxShown bounds the active tasks listed per server and the scheduler
// entries listed.
const maxShown = 50

// cronRuns is how many ticks of each periodic entry the servers page shows.
const cronRuns = 5

func newStoreFacts(si *tide.StoreInfo) *storeFacts {
	f := &storeFacts{StoreInfo: si, Used: byteSize64(si.UsedMemory), Max: "no limit"}
	if si.MaxMemory > 0 {
		f.Max = byteSize64(si.MaxMemory)
		f.Percent = strconv.FormatFloat(100*float64(si.UsedMemory)/float64(si.MaxMemory), 'f', 1, 64) + "%"
	}
	f.Evicting = si.EvictionPolicy != "" && si.EvictionPolicy != "noeviction"
	return f
}

// byteSize64 is byteSize for memory sizes, up to GiB.
func byteSize64(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
	return byteSize(int(n))
}

// cronOutcome describes what became of a tick's task.
func cronOutcome(r tide.CronRun) cronRun {
	c := cronRun{Tick: r.Tick, TaskID: r.TaskID, Exists: r.Task != nil, Outcome: "no task"}
	if r.Task == nil {
		return c
	}
	switch r.Task.State {
	case tide.StateCompleted:
		c.Outcome = "succeeded"
	case tide.StateArchived:
		c.Outcome = "failed"
	case tide.StateActive:
		c.Outcome = "running"
	case tide.StateRetry:
		c.Outcome = "retrying"
	default:
		c.Outcome = "waiting"
	}
	c.Err = previewText(r.Task.LastErr)
	return c
}

func (h *handler) serversPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	ss, err := h.in.Servers(ctx)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	es, err := h.in.SchedulerEntries(ctx)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	d := &serversData{}
	slices.SortFunc(ss, func(a, b tide.ServerInfo) int { return strings.Compare(a.ID, b.ID) })
	for _, s := range ss {
		row := serverRow{ServerInfo: s}
		var qs []string
		for _, q := range slices.Sorted(maps.Keys(s.Queues)) {
			qs = append(qs, fmt.Sprintf("%s (%d)", q, s.Queues[q]))
		}
		row.QueueList = strings.Join(qs, ", ")
		row.Shown = s.Active
		if len(row.Shown) > maxShown {
			row.MoreActive = len(row.Shown) - maxShown
			row.Shown = row.Shown[:maxShown]
		}
		d.Servers = append(d.Servers, row)
	}
	if len(es) > maxShown {
		d.MoreSched = len(es) - maxShown
		es = es[:maxShown]
	}
	d.Schedulers = make([]schedRow, len(es))
	parallel(len(es), 8, func(i int) {
		row := schedRow{SchedulerEntry: es[i]}
		runs, err := h.in.CronHistory(ctx, es[i], cronRuns)
		if err != nil {
			row.RunsErr = previewText(err.Error())
		}
		for _, cr := range runs {
			row.Runs = append(row.Runs, cronOutcome(cr))
		}
		d.Schedulers[i] = row
	})
	si, err := h.in.StoreInfo(ctx)
	switch {
	case err == nil:
		d.Store = newStoreFacts(si)
	case errors.Is(err, tide.ErrNotSupported):
	default:
		if unavailable(err) {
			h.fail(w, r, err, false)
			return
		}
		d.StoreErr = previewText(err.Error())
	}
	h.render(w, http.StatusOK, "servers", h.newView(w, r, "servers", "Servers", d))
}

// cronPageRuns is how many ticks the page of one periodic entry shows.
const cronPageRuns = 30

// cronData is the data of the page of one periodic entry.
type cronData struct {
	Entry tide.SchedulerEntry
	Runs  []cronRun
	N     int
}

// cronPage handles GET /cron?id=ENTRY[&s=SCHEDULER]: the latest runs of one
// periodic entry of a live scheduler.
func (h *handler) cronPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	id, sid := q.Get("id"), q.Get("s")
	if msg := checkID(id); msg != "" || len(sid) > tide.MaxIDLength {
		h.failWith(w, r, http.StatusBadRequest, "Bad request", "The entry ID must be 1 to 256 bytes without control characters.")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	es, err := h.in.SchedulerEntries(ctx)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	var e *tide.SchedulerEntry
	for i := range es {
		if es[i].ID == id && (sid == "" || es[i].SchedulerID == sid) {
			e = &es[i]
			break
		}
	}
	if e == nil {
		h.failWith(w, r, http.StatusNotFound, "Periodic task not found", "No live scheduler has an entry with this ID.")
		return
	}
	runs, err := h.in.CronHistory(ctx, *e, cronPageRuns)
	if err != nil {
		h.fail(w, r, err, false)
		return
	}
	d := &cronData{Entry: *e, N: cronPageRuns}
	for _, cr := range runs {
		c := cronOutcome(cr)
		if cr.Task != nil {
			c.Retried, c.MaxRetry = cr.Task.Retried, cr.Task.MaxRetry
			switch cr.Task.State {
			case tide.StateCompleted:
				c.Finished = cr.Task.CompletedAt
			case tide.StateArchived:
				c.Finished = cr.Task.LastFailedAt
			}
		}
		d.Runs = append(d.Runs, c)
	}
	h.render(w, http.StatusOK, "cron", h.newView(w, r, "servers", "Periodic task "+id, d))
}
