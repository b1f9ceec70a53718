package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/tidequeue/tide"
)

// The same business as Shop, written as one durable handler: reserve the
// stock, wait for the "paid" signal up to the time limit, cancel and
// release the stock otherwise. No timer task, no Delete from the payment
// path, no race between the two: the signal and the time-out are decided
// in one step of the broker, and each step runs once.

// OrderFlow is the task that carries one order from creation to payment or
// cancellation.
type OrderFlow struct {
	OrderID int    `json:"order_id"`
	Item    string `json:"item"`
	Qty     int    `json:"qty"`
}

// TaskType implements tide.TaskArgs.
func (OrderFlow) TaskType() string { return "order:flow" }

// Payment is the payload of the "paid" signal.
type Payment struct {
	Amount int `json:"amount"`
}

// DurableShop keeps orders and stock in memory; OrderFlow tasks move them.
type DurableShop struct {
	client   *tide.Client
	payUntil time.Duration

	mu     sync.Mutex
	nextID int
	orders map[int]*Order
	stock  map[string]int
}

// NewDurableShop returns a shop with the given stock whose orders wait
// payUntil for their payment.
func NewDurableShop(c *tide.Client, payUntil time.Duration, stock map[string]int) *DurableShop {
	return &DurableShop{client: c, payUntil: payUntil, orders: map[int]*Order{}, stock: stock}
}

func flowTaskID(orderID int) string { return "order-flow:" + strconv.Itoa(orderID) }

// Create records an order and starts its flow.
func (s *DurableShop) Create(ctx context.Context, item string, qty int) (*Order, error) {
	s.mu.Lock()
	s.nextID++
	o := &Order{ID: s.nextID, Item: item, Qty: qty, Status: "new"}
	s.orders[o.ID] = o
	s.mu.Unlock()
	t, err := tide.NewTaskFrom(OrderFlow{OrderID: o.ID, Item: item, Qty: qty})
	if err == nil {
		_, err = s.client.Enqueue(ctx, t, tide.TaskID(flowTaskID(o.ID)))
	}
	if err != nil {
		return nil, fmt.Errorf("start the order's flow: %w", err)
	}
	return s.Get(o.ID), nil
}

// Pay sends the order its "paid" signal. It fails with tide.ErrSignalTimeout
// when the order's time ran out first (it is cancelled, or about to be).
func (s *DurableShop) Pay(ctx context.Context, id, amount int) error {
	return s.client.Signal(ctx, "default", flowTaskID(id), "paid", Payment{Amount: amount})
}

// Get returns a copy of an order, or nil.
func (s *DurableShop) Get(id int) *Order {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.orders[id]; o != nil {
		c := *o
		return &c
	}
	return nil
}

// Stock returns a copy of the stock levels.
func (s *DurableShop) Stock() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.stock)
}

func (s *DurableShop) set(id int, status string, stockDelta int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.orders[id]
	o.Status = status
	s.stock[o.Item] += stockDelta
}

// HandleOrder is the order:flow handler: the whole life of an order.
func (s *DurableShop) HandleOrder(ctx context.Context, a OrderFlow) error {
	if _, err := tide.Step(ctx, "reserve", func(context.Context) (bool, error) {
		s.mu.Lock()
		ok := s.stock[a.Item] >= a.Qty
		s.mu.Unlock()
		if !ok {
			s.set(a.OrderID, StatusCancelled, 0)
			return false, nil
		}
		s.set(a.OrderID, StatusAwaitingPayment, -a.Qty)
		return true, nil
	}); err != nil {
		return err
	}
	if o := s.Get(a.OrderID); o.Status == StatusCancelled {
		return nil // out of stock
	}
	_, err := tide.WaitSignal[Payment](ctx, "paid", s.payUntil)
	switch {
	case errors.Is(err, tide.ErrSignalTimeout):
		_, err = tide.Step(ctx, "cancel", func(context.Context) (bool, error) {
			s.set(a.OrderID, StatusCancelled, a.Qty)
			return true, nil
		})
		return err
	case err != nil:
		return err // tide.ErrSuspended: parked until paid or timed out
	}
	_, err = tide.Step(ctx, "confirm", func(context.Context) (bool, error) {
		s.set(a.OrderID, StatusPaid, 0)
		return true, nil
	})
	return err
}

// durableDemo runs the durable version: three orders, one paid.
func durableDemo(ctx context.Context, s *DurableShop, stdout io.Writer) error {
	fmt.Fprintf(stdout, "durable handler: one task per order waits up to %v for its \"paid\" signal\n", s.payUntil)
	var ids []int
	for _, o := range []struct {
		item string
		qty  int
	}{{"widget", 3}, {"gadget", 2}, {"widget", 1}} {
		got, err := s.Create(ctx, o.item, o.qty)
		if err != nil {
			return err
		}
		ids = append(ids, got.ID)
	}
	if err := waitFor(ctx, 10*time.Second, func() bool {
		for _, id := range ids {
			if s.Get(id).Status != StatusAwaitingPayment {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("orders never reserved their stock: %w", err)
	}
	fmt.Fprintf(stdout, "durable stock reserved: %v\n", s.Stock())
	if err := s.Pay(ctx, ids[1], 1999); err != nil {
		return fmt.Errorf("pay: %w", err)
	}
	fmt.Fprintf(stdout, "durable: signalled \"paid\" to order %d\n", ids[1])
	if err := waitFor(ctx, s.payUntil+30*time.Second, func() bool {
		return s.Get(ids[0]).Status == StatusCancelled && s.Get(ids[1]).Status == StatusPaid && s.Get(ids[2]).Status == StatusCancelled
	}); err != nil {
		return fmt.Errorf("orders did not end as expected: %w", err)
	}
	if err := s.Pay(ctx, ids[0], 1); errors.Is(err, tide.ErrSignalTimeout) || errors.Is(err, tide.ErrTaskNotFound) {
		fmt.Fprintf(stdout, "durable: a late payment of order %d is refused: %v\n", ids[0], err)
	} else {
		return fmt.Errorf("a late payment was not refused: %v", err)
	}
	for _, id := range ids {
		fmt.Fprintf(stdout, "durable order %d: %s\n", id, s.Get(id).Status)
	}
	stock := s.Stock()
	fmt.Fprintf(stdout, "durable stock after: %v\n", stock)
	if stock["widget"] != 10 || stock["gadget"] != 3 {
		return errors.New("durable: stock not restored as expected")
	}
	return nil
}

func waitFor(ctx context.Context, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
