package tidetype

import (
	"encoding/json"
	"testing"
	"time"
)

func TestQueueLimitsJSON(t *testing.T) {
	for _, c := range []struct {
		l    QueueLimits
		want string
	}{
		{QueueLimits{}, `{"concurrency":0,"rate":null,"group_concurrency":0,"group_rate":null,"ordered":false}`},
		{QueueLimits{Concurrency: 4, Rate: Rate{Limit: 10, Per: 1500 * time.Millisecond}, GroupConcurrency: 1, GroupRate: Rate{Limit: 3, Per: time.Minute}, Ordered: true},
			`{"concurrency":4,"rate":{"limit":10,"per_seconds":1.5},"group_concurrency":1,"group_rate":{"limit":3,"per_seconds":60},"ordered":true}`},
	} {
		b, err := json.Marshal(c.l)
		if err != nil || string(b) != c.want {
			t.Fatalf("Marshal(%+v) = %s, %v; want %s", c.l, b, err, c.want)
		}
		var back QueueLimits
		if err := json.Unmarshal(b, &back); err != nil || back != c.l {
			t.Fatalf("Unmarshal(%s) = %+v, %v; want %+v", b, back, err, c.l)
		}
	}
	var l QueueLimits
	if err := json.Unmarshal([]byte(`{"rate":"fast"}`), &l); err == nil {
		t.Fatal("a rate that is not an object was accepted")
	}
}
