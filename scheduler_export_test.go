package tide

import (
	"time"

	"github.com/tidequeue/tide/internal/engine"
)

// CronPlanForTest returns a function that plans an entry of spec as the
// scheduler's loop does at each call, treating every tick it fires as
// enqueued.
func CronPlanForTest(spec string, loc *time.Location, p MisfirePolicy, grace time.Duration) (func(now time.Time) (tick time.Time, fire bool), error) {
	sched, _, err := parseCronSpec(spec, loc)
	if err != nil {
		return nil, err
	}
	e := &engine.CronEntry{Schedule: sched, RunOnce: p == MisfireRunOnce}
	return func(now time.Time) (time.Time, bool) {
		tick, fire, _, _ := e.Plan(now, grace)
		if fire {
			e.MarkEnqueued(tick)
		}
		return tick, fire
	}, nil
}

// CronNextForTest returns the first tick of spec after t.
func CronNextForTest(spec string, loc *time.Location, t time.Time) (time.Time, error) {
	sched, _, err := parseCronSpec(spec, loc)
	if err != nil {
		return time.Time{}, err
	}
	return sched.Next(t), nil
}

// CronPrevForTest returns the latest tick of spec at or before now.
func CronPrevForTest(spec string, loc *time.Location, now time.Time, lookback time.Duration) (time.Time, bool, error) {
	sched, _, err := parseCronSpec(spec, loc)
	if err != nil {
		return time.Time{}, false, err
	}
	t, ok := sched.Prev(now, lookback)
	return t, ok, nil
}

// CronTaskIDForTest is the ID of the task of an entry's tick.
var CronTaskIDForTest = engine.CronTaskID
