package tide_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
)

func ExampleInspector_Events() {
	b := membroker.New()
	c, in := tide.NewClient(b), tide.NewInspector(b)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// Queues record events once turned on.
	if err := in.SetQueueEvents(ctx, "orders", true); err != nil {
		fmt.Println(err)
		return
	}
	events, err := in.Events(ctx, tide.EventsFrom{Queues: []string{"orders"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range []string{"order-1", "order-2", "order-3"} {
		if _, err := c.Enqueue(ctx, tide.NewTask("order:ship", nil), tide.Queue("orders"), tide.TaskID(id)); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := c.Delete(ctx, "orders", "order-2"); err != nil {
		fmt.Println(err)
		return
	}

	// Handle two events, then stop, keeping the last event's ID.
	var last string
	for range 2 {
		ev := <-events
		fmt.Println(ev.Kind, ev.TaskID, ev.Type)
		last = ev.ID
	}
	stop()
	for range events { // closes once the reading has ended
	}

	// Later: resume right after the last event handled.
	ctx, stop = context.WithCancel(context.Background())
	defer stop()
	events, err = in.Events(ctx, tide.EventsFrom{After: last})
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		ev := <-events
		fmt.Println(ev.Kind, ev.TaskID, ev.Type)
	}
	stop()
	for range events {
	}

	// A token that is not one is refused.
	_, err = in.Events(context.Background(), tide.EventsFrom{After: "bogus"})
	fmt.Println(errors.Is(err, tide.ErrBadEventToken))
	// Output:
	// enqueued order-1 order:ship
	// enqueued order-2 order:ship
	// enqueued order-3 order:ship
	// deleted order-2 order:ship
	// true
}
