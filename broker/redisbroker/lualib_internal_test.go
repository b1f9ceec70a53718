package redisbroker

import (
	"bytes"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/broker/redisbroker/internal/codec"
	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/tidetype"
)

// evalLib runs body with the lib.lua helpers it uses on a test Redis.
func evalLib(t *testing.T, body string, args ...any) *redis.Cmd {
	t.Helper()
	rdb := redistest.Client(t, redistest.Addr(t))
	l := parseLib(mustRead("groups.lua") + "\n" + mustRead("lib.lua"))
	return rdb.Eval(t.Context(), l.prelude(body)+body, nil, args...)
}

// The follow-up records the scripts build (rec_new) are what internal/codec
// encodes for the same task, with the internal flag; and the headers the
// scripts read from a record (rec_follow) are those codec wrote.
func TestLuaRecordsMatchCodec(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1795674603662)
	for _, c := range []struct {
		typ     string
		payload []byte
		mr      int
	}{
		{broker.FlowType, []byte("f1\nw:wf\ns\n\nid\ntype\nc\n1\n0\n"), broker.FlowMaxRetry},
		{broker.NotifyType, bytes.Repeat([]byte("x"), 300), broker.NotifyMaxRetry},
		{broker.NotifyType, nil, 0},
	} {
		got, err := evalLib(t, "return rec_new(ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]))", c.typ, c.payload, c.mr, now.UnixMilli()).Text()
		if err != nil {
			t.Fatal(err)
		}
		want := codec.Encode(&tidetype.TaskInfo{Type: c.typ, Payload: c.payload, MaxRetry: c.mr, State: tidetype.StatePending, NextProcessAt: now, EnqueuedAt: now}, 0)
		if !codec.Internal([]byte(got)) {
			t.Fatalf("rec_new's record is not internal")
		}
		want[1] |= 0x10
		if got != string(want) {
			t.Fatalf("rec_new(%s, %d bytes) =\n%x\nwant\n%x", c.typ, len(c.payload), got, want)
		}
		m, _, err := codec.Decode("q", "id", []byte(got))
		if err != nil || m.Type != c.typ || !bytes.Equal(m.Payload, c.payload) || m.MaxRetry != c.mr || !m.EnqueuedAt.Equal(now) {
			t.Fatalf("decoded %+v, %v", m, err)
		}
	}
	for _, h := range []map[string]string{
		{broker.FlowHeader: "w:order-42", broker.StepHeader: "charge", broker.NotifyHeader: "https://h.example/x?y=1", "traceparent": "00-a"},
		{broker.NotifyHeader: "https://h.example/"},
		{"only": "other"},
		nil,
	} {
		m := &tidetype.TaskInfo{Type: "t", Payload: bytes.Repeat([]byte("p"), 200), Headers: h, State: tidetype.StatePending,
			NextProcessAt: now, EnqueuedAt: now, Timeout: time.Second, Group: "g", UniqueKey: "u", UniqueTTL: time.Minute}
		res, err := evalLib(t, "return {rec_follow(ARGV[1])}", codec.Encode(m, 7)).StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 3 || res[0] != h[broker.FlowHeader] || res[1] != h[broker.StepHeader] || res[2] != h[broker.NotifyHeader] {
			t.Fatalf("rec_follow of headers %v = %q", h, res)
		}
	}
}
