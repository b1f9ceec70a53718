package encrypt_test

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/membroker"
)

// coreOnly is a broker with Core alone: every other part answers
// ErrNotSupported.
type coreOnly struct {
	broker.Core
	broker.Unsupported
}

// TestWrapperPassesParts: the wrapper is one type whatever the wrapped
// broker has. A part the wrapped broker lacks answers ErrNotSupported
// through it (and through the root package); one it has reaches the
// wrapped broker's, the operator's listings decrypted.
func TestWrapperPassesParts(t *testing.T) {
	ctx := context.Background()
	for name, b := range map[string]broker.Broker{"membroker": membroker.New(), "core only": coreOnly{Core: membroker.New()}} {
		t.Run(name, func(t *testing.T) {
			w := wrap(t, b, newKey(t, 1))
			info, err := tide.NewClient(w).Enqueue(ctx, tide.NewTask("t", []byte("secret payload"), tide.Queue("q"), tide.TaskID("x")))
			if err != nil {
				t.Fatal(err)
			}
			in := tide.NewInspector(w)
			if got, err := in.GetTaskInfo(ctx, "q", info.ID); err != nil || string(got.Payload) != "secret payload" {
				t.Fatalf("GetTaskInfo: %+v, %v", got, err)
			}
			list, err := in.ListTasks(ctx, "q", tide.StatePending, 1, 10)
			_, core := b.(coreOnly)
			switch {
			case core && !errors.Is(err, tide.ErrNotSupported):
				t.Errorf("ListTasks without Admin: %v, want ErrNotSupported", err)
			case !core && (err != nil || len(list) != 1 || string(list[0].Payload) != "secret payload"):
				t.Errorf("ListTasks: %+v, %v; want the task, decrypted", list, err)
			}
			if err := w.Repartition(ctx, "q", 2, nil); !errors.Is(err, broker.ErrNotSupported) {
				t.Errorf("Repartition of an in-memory broker: %v, want ErrNotSupported", err)
			}
			if _, err := tide.NewClient(w).EnqueueWorkflow(ctx, tide.NewWorkflow("wf").Add("a", tide.NewTask("a", nil))); core != errors.Is(err, tide.ErrNotSupported) {
				t.Errorf("EnqueueWorkflow: %v (core only: %v)", err, core)
			}
		})
	}
}

// TestEveryTaskMethodWrapped: every method of broker.Broker that carries a
// task, a payload or a result is the wrapper's own, not the wrapped
// broker's passed through unsealed (the wrapper embeds the broker, so a
// method added to the contract passes through unless the wrapper
// overrides it).
func TestEveryTaskMethodWrapped(t *testing.T) {
	fset := token.NewFileSet()
	own := map[string]bool{}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) != 1 {
				continue
			}
			if star, ok := fd.Recv.List[0].Type.(*ast.StarExpr); ok {
				if id, ok := star.X.(*ast.Ident); ok && id.Name == "wrapper" {
					own[fd.Name.Name] = true
				}
			}
		}
	}
	carries := func(ts ...reflect.Type) bool {
		for _, t := range ts {
			s := t.String()
			if strings.Contains(s, "TaskInfo") || strings.Contains(s, "ReadyStep") || strings.Contains(s, "broker.Flow") ||
				strings.Contains(s, "Settlement") || strings.Contains(s, "Delivery") || s == "[]uint8" {
				return true
			}
		}
		return false
	}
	bt := reflect.TypeFor[broker.Broker]()
	for i := range bt.NumMethod() {
		m := bt.Method(i)
		var ts []reflect.Type
		for j := range m.Type.NumIn() {
			ts = append(ts, m.Type.In(j))
		}
		for j := range m.Type.NumOut() {
			ts = append(ts, m.Type.Out(j))
		}
		if carries(ts...) && !own[m.Name] {
			t.Errorf("broker.Broker.%s carries task data but passes through the wrapper unsealed", m.Name)
		}
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
