package tide_test

import (
	"context"
	"fmt"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
)

// A workflow: ship starts when charge and reserve have both succeeded, and
// reads charge's result.
func ExampleClient_EnqueueWorkflow() {
	b := membroker.New()
	c := tide.NewClient(b)
	shipped := make(chan string, 1)
	mux := tide.NewServeMux()
	mux.HandleFunc("charge", func(ctx context.Context, t *tide.Task) error {
		return tide.WriteResult(ctx, []byte("receipt-42"))
	})
	mux.HandleFunc("reserve", func(ctx context.Context, t *tide.Task) error { return nil })
	mux.HandleFunc("ship", func(ctx context.Context, t *tide.Task) error {
		receipt, err := tide.StepResult(ctx, "charge")
		if err != nil {
			return err
		}
		shipped <- string(receipt)
		return nil
	})
	srv := tide.NewServer(b, tide.Config{Logger: discard()})
	if err := srv.Start(mux); err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	wf := tide.NewWorkflow("order-42").
		Add("charge", tide.NewTask("charge", nil)).
		Add("reserve", tide.NewTask("reserve", nil)).
		Add("ship", tide.NewTask("ship", nil), tide.After("charge", "reserve"))
	info, err := c.EnqueueWorkflow(context.Background(), wf)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(info.ID, info.Total, "steps")
	fmt.Println("shipped with", <-shipped)
	// Output:
	// order-42 3 steps
	// shipped with receipt-42
}

// A batch's callback runs once, when every task has finished, and sees
// how they ended.
func ExampleClient_EnqueueBatch() {
	b := membroker.New()
	c := tide.NewClient(b)
	report := make(chan *tide.BatchInfo, 1)
	mux := tide.NewServeMux()
	mux.HandleFunc("email", func(ctx context.Context, t *tide.Task) error {
		if string(t.Payload()) == "bounce@example.com" {
			return fmt.Errorf("mailbox full: %w", tide.SkipRetry)
		}
		return nil
	})
	mux.HandleFunc("email:report", func(ctx context.Context, t *tide.Task) error {
		bi, _ := tide.GetBatch(ctx)
		report <- bi
		return nil
	})
	srv := tide.NewServer(b, tide.Config{Logger: discard()})
	if err := srv.Start(mux); err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	var tasks []*tide.Task
	for _, to := range []string{"ann@example.com", "bounce@example.com", "bob@example.com"} {
		tasks = append(tasks, tide.NewTask("email", []byte(to)))
	}
	if _, err := c.EnqueueBatch(context.Background(), tasks, tide.OnBatchDone(tide.NewTask("email:report", nil))); err != nil {
		fmt.Println(err)
		return
	}
	bi := <-report
	fmt.Printf("%d sent, %d failed of %d\n", bi.Succeeded, bi.Failed, bi.Total)
	// Output: 2 sent, 1 failed of 3
}
