package encrypt_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
	"github.com/tidequeue/tide/tidetype"
)

// fixedClock is a broker.Clock that tells one time.
type fixedClock struct{ at time.Time }

func (c fixedClock) Now() time.Time { return c.at }

// recordingRepartitioner is a broker.Repartitioner that records its calls.
type recordingRepartitioner struct{ calls *[]string }

func (r recordingRepartitioner) Repartition(_ context.Context, queue string, n int, _ func(int, int)) error {
	*r.calls = append(*r.calls, fmt.Sprint(queue, n))
	return nil
}

// TestOptionalInterfaces wraps brokers with each of the sixteen combinations
// of broker.Admin, broker.Registry, broker.Clock and broker.Repartitioner: a
// type assertion on the wrapper succeeds exactly when it does on the wrapped
// broker, and the part it finds reaches the wrapped broker's (Admin with
// ListTasks decrypting).
func TestOptionalInterfaces(t *testing.T) {
	const (
		A = 1 << iota
		R
		C
		P
	)
	for mask := range 16 {
		name := ""
		for i, l := range "ARCP" {
			if mask&(1<<i) != 0 {
				name += string(l)
			}
		}
		if name == "" {
			name = "BrokerOnly"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			mb := membroker.New()
			var b broker.Broker = mb
			a, r := broker.Admin(mb), broker.Registry(mb)
			c := fixedClock{at: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
			var calls []string
			p := recordingRepartitioner{calls: &calls}
			switch mask {
			case 0:
				b = struct{ broker.Broker }{mb}
			case A:
				b = struct {
					broker.Broker
					broker.Admin
				}{mb, a}
			case R:
				b = struct {
					broker.Broker
					broker.Registry
				}{mb, r}
			case C:
				b = struct {
					broker.Broker
					broker.Clock
				}{mb, c}
			case P:
				b = struct {
					broker.Broker
					broker.Repartitioner
				}{mb, p}
			case A | R:
				b = struct {
					broker.Broker
					broker.Admin
					broker.Registry
				}{mb, a, r}
			case A | C:
				b = struct {
					broker.Broker
					broker.Admin
					broker.Clock
				}{mb, a, c}
			case A | P:
				b = struct {
					broker.Broker
					broker.Admin
					broker.Repartitioner
				}{mb, a, p}
			case R | C:
				b = struct {
					broker.Broker
					broker.Registry
					broker.Clock
				}{mb, r, c}
			case R | P:
				b = struct {
					broker.Broker
					broker.Registry
					broker.Repartitioner
				}{mb, r, p}
			case C | P:
				b = struct {
					broker.Broker
					broker.Clock
					broker.Repartitioner
				}{mb, c, p}
			case A | R | C:
				b = struct {
					broker.Broker
					broker.Admin
					broker.Registry
					broker.Clock
				}{mb, a, r, c}
			case A | R | P:
				b = struct {
					broker.Broker
					broker.Admin
					broker.Registry
					broker.Repartitioner
				}{mb, a, r, p}
			case A | C | P:
				b = struct {
					broker.Broker
					broker.Admin
					broker.Clock
					broker.Repartitioner
				}{mb, a, c, p}
			case R | C | P:
				b = struct {
					broker.Broker
					broker.Registry
					broker.Clock
					broker.Repartitioner
				}{mb, r, c, p}
			case A | R | C | P:
				b = struct {
					broker.Broker
					broker.Admin
					broker.Registry
					broker.Clock
					broker.Repartitioner
				}{mb, a, r, c, p}
			}
			w := wrap(t, b, newKey(t, 1))
			enqueue(t, w, task("q", "x", "secret payload"))

			wa, okA := w.(broker.Admin)
			wr, okR := w.(broker.Registry)
			wc, okC := w.(broker.Clock)
			wp, okP := w.(broker.Repartitioner)
			for _, c := range []struct {
				iface     string
				got, want bool
			}{
				{"Admin", okA, mask&A != 0}, {"Registry", okR, mask&R != 0},
				{"Clock", okC, mask&C != 0}, {"Repartitioner", okP, mask&P != 0},
			} {
				if c.got != c.want {
					t.Errorf("wrapper implements %s: %v, want %v (%T)", c.iface, c.got, c.want, w)
				}
			}
			if okA {
				ts, err := wa.ListTasks(ctx, "q", tidetype.StatePending, 0, 10)
				if err != nil || len(ts) != 1 || string(ts[0].Payload) != "secret payload" {
					t.Errorf("ListTasks through the wrapper: %v, %v", ts, err)
				}
				if qs, err := wa.Queues(ctx); err != nil || len(qs) != 1 {
					t.Errorf("Queues through the wrapper: %v, %v", qs, err)
				}
			}
			if okR {
				if err := wr.RegisterServer(ctx, tidetype.ServerInfo{ID: "s1"}, time.Minute); err != nil {
					t.Fatal(err)
				}
				if ss, _ := mb.Servers(ctx); len(ss) != 1 || ss[0].ID != "s1" {
					t.Errorf("RegisterServer did not reach the wrapped broker: %v", ss)
				}
			}
			if okC && !wc.Now().Equal(c.at) {
				t.Errorf("Clock through the wrapper = %v, want the wrapped broker's %v", wc.Now(), c.at)
			}
			if okP {
				if err := wp.Repartition(ctx, "q", 4, nil); err != nil || len(calls) != 1 || calls[0] != "q4" {
					t.Errorf("Repartition through the wrapper: %v, calls %v", err, calls)
				}
			}

			// The root package sees the same: the Inspector needs Admin.
			in := tide.NewInspector(w)
			_, err := in.Queues(ctx)
			if mask&A == 0 && !errors.Is(err, tide.ErrNotSupported) {
				t.Errorf("Inspector.Queues without Admin: %v, want ErrNotSupported", err)
			}
			if mask&A != 0 && err != nil {
				t.Errorf("Inspector.Queues with Admin: %v", err)
			}
			if info, err := in.GetTaskInfo(ctx, "q", "x"); err != nil || string(info.Payload) != "secret payload" {
				t.Errorf("Inspector.GetTaskInfo: %v, %v", info, err)
			}
		})
	}
}

// TestShippedBrokersKeepTheirParts: the wrapped membroker is still an Admin,
// Registry and Clock, and not a Repartitioner.
func TestShippedBrokersKeepTheirParts(t *testing.T) {
	w := wrap(t, membroker.New(), newKey(t, 1))
	_, a := w.(broker.Admin)
	_, r := w.(broker.Registry)
	_, c := w.(broker.Clock)
	_, p := w.(broker.Repartitioner)
	if !a || !r || !c || p {
		t.Errorf("wrapped membroker: Admin %v Registry %v Clock %v Repartitioner %v; want true true true false", a, r, c, p)
	}
}

// TestQueueLimitsPassThrough: queue limits set through the wrapper reach the
// wrapped broker and read back through both.
func TestQueueLimitsPassThrough(t *testing.T) {
	ctx := context.Background()
	inner := membroker.New()
	w := wrap(t, inner, newKey(t, 1))
	want := tide.QueueLimits{Concurrency: 3, Rate: tide.Rate{Limit: 10, Per: time.Second}}
	if err := tide.NewInspector(w).SetQueueLimits(ctx, "q", want); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]broker.Broker{"wrapper": w, "wrapped broker": inner} {
		if got, err := tide.NewInspector(b).QueueLimits(ctx, "q"); err != nil || got != want {
			t.Errorf("QueueLimits through the %s = %+v, %v; want %+v", name, got, err, want)
		}
	}
}

// TestEventsPassThrough: task events are turned on and read through the
// wrapper as the wrapped broker records them (they carry no payload).
func TestEventsPassThrough(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := wrap(t, membroker.New(), newKey(t, 1))
	in := tide.NewInspector(w)
	if err := in.SetQueueEvents(ctx, "q", true); err != nil {
		t.Fatal(err)
	}
	ch, err := in.Events(ctx, tide.EventsFrom{Queues: []string{"q"}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := tide.NewClient(w).Enqueue(ctx, tide.NewTask("t", []byte("secret payload"), tide.Queue("q")))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-ch:
		if ev.Kind != tide.EventEnqueued || ev.TaskID != info.ID || ev.Type != "t" || ev.ID == "" {
			t.Errorf("event %+v, want the enqueue of %s", ev, info.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event through the wrapper")
	}
	inner := struct{ broker.Broker }{membroker.New()}
	if _, err := tide.NewInspector(wrap(t, inner, newKey(t, 1))).Events(ctx, tide.EventsFrom{Queues: []string{"q"}}); err == nil {
		t.Error("Events through a wrapper of a broker without events: no error")
	}
	cancel()
	for range ch {
	}
}
