package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tidequeue/tide"
)

// CancelOrder is the task that cancels an order left unpaid.
type CancelOrder struct {
	OrderID int `json:"order_id"`
}

// TaskType implements tide.TaskArgs.
func (CancelOrder) TaskType() string { return "order:cancel" }

// Order states.
const (
	StatusAwaitingPayment = "awaiting_payment"
	StatusPaid            = "paid"
	StatusCancelled       = "cancelled"
)

// Order is one order.
type Order struct {
	ID     int    `json:"id"`
	Item   string `json:"item"`
	Qty    int    `json:"qty"`
	Status string `json:"status"`
}

// Shop keeps orders and stock in memory and schedules the cancel timeouts.
type Shop struct {
	client      *tide.Client
	cancelAfter time.Duration
	log         *slog.Logger

	mu     sync.Mutex
	nextID int
	orders map[int]*Order
	stock  map[string]int
}

// NewShop returns a shop with the given stock.
func NewShop(c *tide.Client, cancelAfter time.Duration, stock map[string]int, log *slog.Logger) *Shop {
	return &Shop{client: c, cancelAfter: cancelAfter, log: log, orders: map[int]*Order{}, stock: stock}
}

func cancelTaskID(orderID int) string { return "order-cancel:" + strconv.Itoa(orderID) }

var (
	errOutOfStock = errors.New("out of stock")
	errNotFound   = errors.New("no such order")
	errNotPayable = errors.New("order cannot be paid")
)

// Create reserves stock for an order and schedules its cancellation.
func (s *Shop) Create(ctx context.Context, item string, qty int) (*Order, error) {
	if item == "" || qty < 1 || qty > 1000 {
		return nil, fmt.Errorf("invalid order: item must be set and qty between 1 and 1000")
	}
	s.mu.Lock()
	if s.stock[item] < qty {
		s.mu.Unlock()
		return nil, errOutOfStock
	}
	s.stock[item] -= qty
	s.nextID++
	o := &Order{ID: s.nextID, Item: item, Qty: qty, Status: StatusAwaitingPayment}
	s.orders[o.ID] = o
	s.mu.Unlock()

	task, err := tide.NewTaskFrom(CancelOrder{OrderID: o.ID})
	if err == nil {
		_, err = s.client.Enqueue(ctx, task, tide.TaskID(cancelTaskID(o.ID)), tide.ProcessIn(s.cancelAfter))
	}
	if err != nil {
		// Without its timeout the reservation could leak: undo the order.
		s.mu.Lock()
		s.stock[item] += qty
		delete(s.orders, o.ID)
		s.mu.Unlock()
		return nil, fmt.Errorf("schedule cancellation: %w", err)
	}
	return s.copy(o), nil
}

// Pay marks an order paid and deletes its cancel task.
func (s *Shop) Pay(ctx context.Context, id int) (*Order, error) {
	s.mu.Lock()
	o := s.orders[id]
	switch {
	case o == nil:
		s.mu.Unlock()
		return nil, errNotFound
	case o.Status != StatusAwaitingPayment:
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: it is %s", errNotPayable, o.Status)
	}
	o.Status = StatusPaid
	s.mu.Unlock()
	// The order is paid whatever happens next: the cancel handler leaves
	// paid orders alone, so a task that could not be deleted is harmless.
	err := s.client.Delete(ctx, "default", cancelTaskID(id))
	if err != nil && !errors.Is(err, tide.ErrTaskNotFound) {
		s.log.Warn("could not delete the cancel task; the handler will ignore it", "order", id, "err", err)
	}
	return s.Get(id)
}

// Get returns a copy of an order.
func (s *Shop) Get(id int) (*Order, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.orders[id]
	if o == nil {
		return nil, errNotFound
	}
	return s.copy(o), nil
}

// Stock returns a copy of the stock levels.
func (s *Shop) Stock() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.stock)
}

func (s *Shop) copy(o *Order) *Order { c := *o; return &c }

// HandleCancel is the order:cancel handler. It is idempotent: a paid or
// already cancelled order is left as it is, so a redelivered task is
// harmless.
func (s *Shop) HandleCancel(ctx context.Context, a CancelOrder) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.orders[a.OrderID]
	if o == nil {
		return fmt.Errorf("order %d unknown: %w", a.OrderID, tide.SkipRetry)
	}
	if o.Status != StatusAwaitingPayment {
		return nil
	}
	o.Status = StatusCancelled
	s.stock[o.Item] += o.Qty
	s.log.Info("order cancelled: not paid in time; stock released", "order", o.ID, "item", o.Item, "qty", o.Qty)
	return nil
}

// Routes returns the HTTP API:
//
//	POST /orders            {"item": "widget", "qty": 2}
//	POST /orders/{id}/pay
//	GET  /orders/{id}
//	GET  /stock
func (s *Shop) Routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Item string `json:"item"`
			Qty  int    `json:"qty"`
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeErr(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
			return
		}
		o, err := s.Create(r.Context(), req.Item, req.Qty)
		switch {
		case errors.Is(err, errOutOfStock):
			writeErr(w, http.StatusConflict, err.Error())
		case err != nil:
			writeErr(w, http.StatusBadRequest, err.Error())
		default:
			writeJSON(w, http.StatusCreated, o)
		}
	})
	mux.HandleFunc("POST /orders/{id}/pay", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.PathValue("id"))
		if err != nil {
			writeErr(w, http.StatusBadRequest, "order id must be a number")
			return
		}
		o, err := s.Pay(r.Context(), id)
		switch {
		case errors.Is(err, errNotFound):
			writeErr(w, http.StatusNotFound, err.Error())
		case err != nil:
			writeErr(w, http.StatusConflict, err.Error())
		default:
			writeJSON(w, http.StatusOK, o)
		}
	})
	mux.HandleFunc("GET /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.PathValue("id"))
		if err != nil {
			writeErr(w, http.StatusBadRequest, "order id must be a number")
			return
		}
		o, err := s.Get(id)
		if err != nil {
			writeErr(w, http.StatusNotFound, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, o)
	})
	mux.HandleFunc("GET /stock", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Stock())
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
