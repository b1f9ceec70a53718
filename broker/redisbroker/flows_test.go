package redisbroker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// The flows index forgets expired flows as new ones are created, even
// when the oldest entries belong to flows that still run.
func TestFlowIndexSwept(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rdb, prefix, b := e.rdb, e.prefix, e.b
	ctx := context.Background()
	create := func(id string, retention time.Duration, end bool) {
		t.Helper()
		m := &tidetype.TaskInfo{ID: id + ".a", Queue: "q", Type: "t", State: tidetype.StatePending, NextProcessAt: time.Now(), EnqueuedAt: time.Now()}
		f := &broker.Flow{ID: id, Kind: tidetype.KindWorkflow, Digest: "d", Retention: retention, CreatedAt: time.Now(),
			Steps: []broker.FlowStep{{Name: "a", Task: m}}}
		if _, err := b.CreateFlow(ctx, f); err != nil {
			t.Fatal(err)
		}
		if end {
			if _, err := b.ReleaseSteps(ctx, id, []string{"a"}); err != nil {
				t.Fatal(err)
			}
			if _, err := b.EndStep(ctx, id, "a", id+".a", true, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 10 {
		create(fmt.Sprint("running-", i), time.Hour, false) // the oldest never expire here
	}
	for i := range 40 {
		create(fmt.Sprint("short-", i), time.Millisecond, true)
	}
	time.Sleep(20 * time.Millisecond)
	for i := range 10 {
		create(fmt.Sprint("later-", i), time.Hour, false)
	}
	n, err := rdb.ZCard(ctx, prefix+":flows:w").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n > 25 {
		t.Fatalf("the index holds %d entries; 20 flows are alive and 40 expired", n)
	}
}
