package brokertest

import (
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// promiseTests run when the broker implements broker.Admin. They check
// promises of flow control that hold across changes: a replaced task's
// place, a rate's memory of earlier starts, limits across DeleteQueue, a
// throttle's end on the broker's clock.
var promiseTests = []struct {
	name string
	fn   func(t *testing.T, b broker.Broker, a broker.Admin)
}{
	{"ReplaceFinishedTakesNewPlace", testReplaceFinishedTakesNewPlace},
}

// testReplaceFinishedTakesNewPlace: a grouped task that replaces a
// finished one (completed, archived) is a new task: in its group it comes
// after the tasks enqueued before it, also in an ordered group.
func testReplaceFinishedTakesNewPlace(t *testing.T, b broker.Broker, a broker.Admin) {
	for _, st := range []tidetype.TaskState{tidetype.StateCompleted, tidetype.StateArchived} {
		for _, ordered := range []bool{false, true} {
			name := st.String()
			if ordered {
				name += "Ordered"
			}
			t.Run(name, func(t *testing.T) {
				q := "replace-finished-" + name
				setLimits(t, a, q, tidetype.QueueLimits{Ordered: ordered})
				x := gmsg(q, "x", "G")
				if st == tidetype.StateCompleted {
					x.Retention = time.Hour
				}
				enqueue(t, b, x)
				s := outcomeOf(dequeueOne(t, b, q, time.Minute), broker.SettleDone)
				if st == tidetype.StateArchived {
					s.Kind, s.Err = broker.SettleArchive, "bad"
				}
				settleOK(t, b, s)
				if got := get(t, b, q, x.ID).State; got != st {
					t.Fatalf("task x is %v, want %v", got, st)
				}
				later := gmsgs(q, "later", "G", 2)
				enqueue(t, b, later...)
				if err := enqueueReplace(t, b, replacement(x)); err != nil {
					t.Fatalf("Replace of a %v task: %v", st, err)
				}
				for _, want := range []string{later[0].ID, later[1].ID, x.ID} {
					d := dequeueOne(t, b, q, time.Minute)
					if d.Task.ID != want {
						t.Fatalf("dequeued %q, want %q: a task replacing a finished one comes after the tasks enqueued before it", d.Task.ID, want)
					}
					settleOK(t, b, outcomeOf(d, broker.SettleDone))
				}
			})
		}
	}
}
