package tide_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker/membroker"
)

// FuzzEnqueue feeds arbitrary task fields and option values to Enqueue: it
// must either store the task with exactly those settings or refuse it with
// ErrInvalidTask, never panic.
func FuzzEnqueue(f *testing.F) {
	f.Add("order:cancel", []byte(`{"id":1}`), "default", "id-1", int64(900_000), 25, int64(0), int64(3_600_000), false)
	f.Add("", []byte(nil), "bad queue", "", int64(-1), -1, int64(-5), int64(0), true)
	f.Add("t\x00", []byte{0xff}, "q:{x}", "\n", int64(1)<<62, 1<<30, int64(1), int64(-1), true)
	f.Fuzz(func(t *testing.T, typ string, payload []byte, queue, id string, delayMS int64, maxRetry int, timeoutMS, retentionMS int64, unique bool) {
		c := tide.NewClient(membroker.New())
		opts := []tide.Option{
			tide.Queue(queue), tide.ProcessIn(time.Duration(delayMS) * time.Millisecond), tide.MaxRetry(maxRetry),
			tide.Timeout(time.Duration(timeoutMS) * time.Millisecond), tide.Retention(time.Duration(retentionMS) * time.Millisecond),
		}
		if id != "" {
			opts = append(opts, tide.TaskID(id))
		}
		if unique {
			opts = append(opts, tide.Unique(time.Hour))
		}
		info, err := c.Enqueue(context.Background(), tide.NewTask(typ, payload), opts...)
		if err != nil {
			if !errors.Is(err, tide.ErrInvalidTask) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if info.Type != typ || info.Queue != queue || info.MaxRetry != maxRetry || (id != "" && info.ID != id) {
			t.Fatalf("stored %+v for type=%q queue=%q id=%q maxRetry=%d", info, typ, queue, id, maxRetry)
		}
		want := tide.StatePending
		if delayMS >= 1 {
			want = tide.StateScheduled
		}
		if info.State != want {
			t.Fatalf("state %v for a delay of %dms", info.State, delayMS)
		}
	})
}
