package redisbroker_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/redisbroker"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/internal/testwait"
)

// On a 3-master Cluster, with queues of several partitions spread over
// the masters: a diamond whose steps run in three queues passes results
// along, and a 2,000-task batch's callback runs once.
func TestClusterWorkflowAndBatch(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	rdb := c.Client(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	b := redisbroker.New(rdb, redisbroker.WithPrefix(prefix), redisbroker.WithPartitions(clusterParts))
	t.Cleanup(func() { _ = b.Close() })
	var callbacks atomic.Int64
	srv := tide.NewServer(b, tide.Config{Concurrency: 16, Queues: map[string]int{"a": 1, "b": 1, "c": 1}, Logger: quietLogger()})
	err := srv.Start(tide.HandlerFunc(func(ctx context.Context, task *tide.Task) error {
		if task.Type() == "callback" {
			callbacks.Add(1)
			return nil
		}
		step, _ := tide.GetStepName(ctx)
		out := step
		for _, dep := range strings.Split(string(task.Payload()), ",") {
			if dep == "" {
				continue
			}
			r, err := tide.StepResult(ctx, dep)
			if err != nil {
				return err
			}
			out += "(" + string(r) + ")"
		}
		return tide.WriteResult(ctx, []byte(out))
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	cl := tide.NewClient(b)
	in := tide.NewInspector(b)
	wf := tide.NewWorkflow("cluster-diamond").
		Add("w", tide.NewTask("step", nil, tide.Queue("a"))).
		Add("x", tide.NewTask("step", []byte("w"), tide.Queue("b")), tide.After("w")).
		Add("y", tide.NewTask("step", []byte("w"), tide.Queue("c")), tide.After("w")).
		Add("z", tide.NewTask("step", []byte("x,y"), tide.Queue("a")), tide.After("x", "y"))
	if _, err := cl.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}
	tasks := make([]*tide.Task, 2000)
	for i := range tasks {
		tasks[i] = tide.NewTask("row", nil, tide.Queue([]string{"a", "b", "c"}[i%3]))
	}
	bi, err := cl.EnqueueBatch(ctx, tasks, tide.OnBatchDone(tide.NewTask("callback", nil, tide.Queue("b"))))
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 60*time.Second, func() error {
		w, err1 := in.GetWorkflow(ctx, "cluster-diamond")
		got, err2 := in.GetBatch(ctx, bi.ID)
		if err1 != nil || err2 != nil || w.State == tide.FlowRunning || got.FinishedAt.IsZero() {
			return fmt.Errorf("not done: %v %v %v %v", w, err1, got, err2)
		}
		if w.State != tide.FlowSucceeded || got.Succeeded != 2000 || got.State != tide.FlowSucceeded {
			t.Fatalf("workflow %v, batch %+v", w.State, got)
		}
		return nil
	})
	z, err := in.GetTaskInfo(ctx, "a", "cluster-diamond/z")
	if err != nil || string(z.Result) != "z(x(w))(y(w))" {
		t.Fatalf("z = %v, %v", z, err)
	}
	time.Sleep(200 * time.Millisecond) // a second callback would have had time to run
	if n := callbacks.Load(); n != 1 {
		t.Fatalf("callback ran %d times", n)
	}
}
