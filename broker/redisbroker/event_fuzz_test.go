package redisbroker

import (
	"testing"

	"github.com/tidequeue/tide/broker"
)

// FuzzParseEvent: event payloads come from Redis, where anyone with access
// can publish; parsing must never panic and must only accept the formats
// the scripts write.
func FuzzParseEvent(f *testing.F) {
	for _, s := range []string{"p0", "p12", "s3:1790000000123", "cabc:def", "s:", "s1:x", "p", "x9", "s-1:-5", "r2", "l", "r"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		ev, ok := parseEvent("q", payload)
		if !ok {
			return
		}
		switch ev.Kind {
		case broker.EventPending, broker.EventScheduled, broker.EventCancel, broker.EventReleased, broker.EventLayout:
		default:
			t.Fatalf("%q parsed to unknown kind %d", payload, ev.Kind)
		}
		if ev.Queue != "q" {
			t.Fatalf("queue %q", ev.Queue)
		}
	})
}
