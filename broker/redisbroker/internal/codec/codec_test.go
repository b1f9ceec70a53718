package codec

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/tidequeue/tide/tidetype"
)

func sample() *tidetype.TaskInfo {
	now := time.UnixMilli(1_790_000_000_123)
	return &tidetype.TaskInfo{
		ID: "id-1", Queue: "q", Type: "order:cancel", Payload: []byte{0, 1, 2, 0xff},
		Headers: map[string]string{"traceparent": "00-abc-def-01", "k": ""},
		State:   tidetype.StateRetry, MaxRetry: 25, Retried: 3, LastErr: "boom\nstack",
		NextProcessAt: now.Add(time.Minute), EnqueuedAt: now, LastFailedAt: now.Add(time.Second),
		CompletedAt: now.Add(2 * time.Second), Timeout: 30 * time.Second, Deadline: now.Add(time.Hour),
		Retention: 24 * time.Hour, UniqueKey: "digest", UniqueTTL: time.Hour, Group: "tenant-7",
	}
}

func TestRoundTrip(t *testing.T) {
	m := sample()
	b := Encode(m, 7)
	got, tok, err := Decode("q", "id-1", b)
	if err != nil {
		t.Fatal(err)
	}
	if tok != 7 {
		t.Fatalf("token = %d", tok)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
	}
	min := &tidetype.TaskInfo{Type: "t", State: tidetype.StatePending}
	got, _, err = Decode("", "", Encode(min, 0))
	if err != nil || got.Type != "t" || got.Payload != nil || got.Headers != nil || !got.NextProcessAt.IsZero() {
		t.Fatalf("minimal: %+v, %v", got, err)
	}
}

func TestCompact(t *testing.T) {
	m := &tidetype.TaskInfo{Type: "order:cancel", Payload: bytes.Repeat([]byte{'x'}, 64), State: tidetype.StateScheduled,
		MaxRetry: 25, NextProcessAt: time.Now(), EnqueuedAt: time.Now()}
	n := len(Encode(m, 0))
	// header + type + payload + a handful of varint bytes
	if limit := HeaderSize + len(m.Type) + len(m.Payload) + 16; n > limit {
		t.Fatalf("record is %d bytes, over %d", n, limit)
	}
}

func TestDecodeRejectsCorruptInput(t *testing.T) {
	good := Encode(sample(), 1)
	cases := map[string][]byte{
		"empty":         nil,
		"short":         good[:10],
		"bad version":   append([]byte{9}, good[1:]...),
		"bad state":     append([]byte{Version, 8}, good[2:]...), // state 0: 1 to 7 are all states now
		"body too long": func() []byte { b := bytes.Clone(good); b[offBodyLen], b[offBodyLen+1] = 0xff, 0xff; return b }(),
		"truncated":     good[:HeaderSize+5],
	}
	for name, b := range cases {
		if _, _, err := Decode("q", "id", b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestDecodeHeaderOfCorruptBody(t *testing.T) {
	b := Encode(sample(), 1)
	bl := int(b[offBodyLen])<<16 | int(b[offBodyLen+1])<<8 | int(b[offBodyLen+2])
	for i := HeaderSize; i < HeaderSize+bl; i++ {
		b[i] = 0xff
	}
	m, err := DecodeHeader("q", "id", b)
	if err != nil {
		t.Fatal(err)
	}
	if m.State != tidetype.StateRetry || m.Retried != 3 || m.LastErr != "boom\nstack" || m.Type != "" {
		t.Fatalf("header view = %+v", m)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(sample(), 1))
	f.Add(Encode(&tidetype.TaskInfo{Type: "t", State: tidetype.StatePending}, 0))
	f.Add([]byte("not a record"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, tok, err := Decode("q", "id", b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			_, _ = DecodeHeader("q", "id", b)
			return
		}
		// What decodes must survive a round trip unchanged.
		again, tok2, err := Decode("q", "id", Encode(m, tok))
		if err != nil || tok2 != tok {
			t.Fatalf("re-decode: %v", err)
		}
		if !reflect.DeepEqual(normalize(again), normalize(m)) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", m, again)
		}
	})
}

// normalize maps empty collections to nil for comparison.
func normalize(m *tidetype.TaskInfo) *tidetype.TaskInfo {
	c := *m
	if len(c.Payload) == 0 {
		c.Payload = nil
	}
	if len(c.Headers) == 0 {
		c.Headers = nil
	}
	return &c
}
