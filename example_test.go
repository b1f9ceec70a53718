package tide_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
)

func ExampleNewTask() {
	t := tide.NewTask("email:welcome", []byte(`{"user_id":42}`), tide.Queue("mail"), tide.MaxRetry(5))
	t.Headers()["tenant"] = "acme"
	fmt.Println(t.Type(), string(t.Payload()), t.Headers()["tenant"])
	// Output: email:welcome {"user_id":42} acme
}

func ExampleClient_Enqueue() {
	b := membroker.New()
	c := tide.NewClient(b)
	ctx := context.Background()

	// Cancel order 42 in 15 minutes unless it is paid.
	info, err := c.Enqueue(ctx, tide.NewTask("order:cancel", []byte(`{"order_id":42}`)),
		tide.TaskID("order-cancel:42"), tide.ProcessIn(15*time.Minute))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(info.ID, info.Queue, info.State)

	// The same ID again is refused: the ID is an idempotency key.
	_, err = c.Enqueue(ctx, tide.NewTask("order:cancel", nil), tide.TaskID("order-cancel:42"))
	fmt.Println(errors.Is(err, tide.ErrTaskIDConflict))

	// Paid in time: delete the cancellation.
	fmt.Println(c.Delete(ctx, "default", "order-cancel:42"))
	// Output:
	// order-cancel:42 default scheduled
	// true
	// <nil>
}

func ExampleClient_Enqueue_invalid() {
	c := tide.NewClient(membroker.New())
	_, err := c.Enqueue(context.Background(), tide.NewTask("report", nil), tide.ProcessIn(-time.Minute))
	fmt.Println(err)
	fmt.Println(errors.Is(err, tide.ErrInvalidTask))
	// Output:
	// tide: invalid task: ProcessIn(-1m0s): negative delay
	// true
}

func ExampleServeMux() {
	mux := tide.NewServeMux()
	mux.HandleFunc("order:cancel", func(ctx context.Context, t *tide.Task) error {
		fmt.Println("exact:", t.Type())
		return nil
	})
	mux.HandleFunc("order:", func(ctx context.Context, t *tide.Task) error {
		fmt.Println("prefix:", t.Type())
		return nil
	})
	mux.Use(func(next tide.Handler) tide.Handler {
		return tide.HandlerFunc(func(ctx context.Context, t *tide.Task) error {
			err := next.ProcessTask(ctx, t)
			fmt.Println("  middleware saw", t.Type(), "err:", err)
			return err
		})
	})
	ctx := context.Background()
	_ = mux.ProcessTask(ctx, tide.NewTask("order:cancel", nil))
	_ = mux.ProcessTask(ctx, tide.NewTask("order:ship", nil))
	_ = mux.ProcessTask(ctx, tide.NewTask("email:send", nil))
	// Output:
	// exact: order:cancel
	//   middleware saw order:cancel err: <nil>
	// prefix: order:ship
	//   middleware saw order:ship err: <nil>
	//   middleware saw email:send err: tide: no handler for task type: "email:send"
}

type WelcomeEmail struct {
	UserID int    `json:"user_id"`
	Locale string `json:"locale"`
}

func (WelcomeEmail) TaskType() string { return "email:welcome" }

func ExampleHandleArgs() {
	mux := tide.NewServeMux()
	tide.HandleArgs(mux, func(ctx context.Context, a WelcomeEmail) error {
		fmt.Printf("welcome user %d (%s)\n", a.UserID, a.Locale)
		return nil
	})
	t, _ := tide.NewTaskFrom(WelcomeEmail{UserID: 7, Locale: "de"})
	_ = mux.ProcessTask(context.Background(), t)

	// A payload that does not decode is archived at once, not retried.
	err := mux.ProcessTask(context.Background(), tide.NewTask("email:welcome", []byte(`{"user_id":"seven"}`)))
	fmt.Println(errors.Is(err, tide.SkipRetry))
	// Output:
	// welcome user 7 (de)
	// true
}

func ExampleServer() {
	b := membroker.New()
	c := tide.NewClient(b)
	done := make(chan struct{})
	mux := tide.NewServeMux()
	mux.HandleFunc("hello", func(ctx context.Context, t *tide.Task) error {
		n, _ := tide.GetRetryCount(ctx)
		fmt.Printf("hello %s (retry %d)\n", t.Payload(), n)
		close(done)
		return nil
	})
	srv := tide.NewServer(b, tide.Config{Concurrency: 4, Logger: discard()})
	if err := srv.Start(mux); err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	if _, err := c.Enqueue(context.Background(), tide.NewTask("hello", []byte("world"))); err != nil {
		fmt.Println(err)
		return
	}
	<-done
	// Output: hello world (retry 0)
}

func ExampleRetrySchedule() {
	delay := tide.RetrySchedule(15*time.Second, 3*time.Minute, 10*time.Minute)
	for n := 1; n <= 4; n++ {
		fmt.Println(n, delay(n, nil, nil))
	}
	// Output:
	// 1 15s
	// 2 3m0s
	// 3 10m0s
	// 4 10m0s
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A grouped task keeps the ID you choose (on a queue of one partition, the
// default): the order-cancel pattern, fair per shop, cancelled by the
// order's ID.
func ExampleGroup() {
	b := membroker.New()
	c := tide.NewClient(b)
	ctx := context.Background()

	info, err := c.Enqueue(ctx, tide.NewTask("order:cancel", []byte(`{"order_id":42}`)),
		tide.TaskID("order-cancel:42"), tide.Group("shop-7"), tide.ProcessIn(15*time.Minute))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(info.ID, info.Group)
	// The ID names one task of the queue, whatever the group.
	_, err = c.Enqueue(ctx, tide.NewTask("order:cancel", nil), tide.TaskID("order-cancel:42"), tide.Group("shop-8"))
	fmt.Println(errors.Is(err, tide.ErrTaskIDConflict))
	// The order was paid.
	fmt.Println(c.Cancel(ctx, "default", "order-cancel:42"))
	// Output:
	// order-cancel:42 shop-7
	// true
	// <nil>
}
