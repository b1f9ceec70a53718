package broker_test

import (
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tidequeue/tide/broker"
)

// TestEventTokenRoundTrip: positions come back sorted, whatever order they
// were encoded in.
func TestEventTokenRoundTrip(t *testing.T) {
	ps := []broker.EventPosition{
		{Queue: "orders", Epoch: 1, Partition: 2, Seq: 77, Skip: 3},
		{Queue: "emails", Seq: 1 << 40},
		{Queue: "orders", Epoch: 1, Partition: 0},
		{Queue: "orders", Partition: 5, Ms: 9, Seq: 1},
	}
	tok := broker.EncodeEventToken(ps)
	got, err := broker.DecodeEventToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	want := []broker.EventPosition{ps[1], ps[3], ps[2], ps[0]}
	if !slices.Equal(got, want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
	if qs := broker.TokenQueues(got); !slices.Equal(qs, []string{"emails", "orders"}) {
		t.Errorf("TokenQueues = %q", qs)
	}
	if qs, err := broker.CheckTokenQueues([]string{"orders", "emails", "orders"}, got); err != nil || len(qs) != 2 {
		t.Errorf("CheckTokenQueues of the same queues: %q, %v", qs, err)
	}
	if _, err := broker.CheckTokenQueues([]string{"orders"}, got); !errors.Is(err, broker.ErrBadEventToken) || !strings.Contains(err.Error(), "emails") {
		t.Errorf("CheckTokenQueues of other queues: %v", err)
	}
}

// TestEventTokenRefused: every malformed token is refused with an error
// wrapping ErrBadEventToken that names the problem.
func TestEventTokenRefused(t *testing.T) {
	good := broker.EncodeEventToken([]broker.EventPosition{{Queue: "q", Seq: 5}})
	raw, _ := base64.RawURLEncoding.DecodeString(good[2:])
	flipped := append([]byte(nil), raw...)
	flipped[2] ^= 0x40
	for tok, why := range map[string]string{
		"":                 "empty",
		"hello":            "does not start",
		"e2" + good[2:]:    "version 2",
		"e1!!!!":           "base64url",
		"e1AAA":            "cut short",
		good[:len(good)-2]: "",
		"e1" + base64.RawURLEncoding.EncodeToString(flipped): "checksum",
	} {
		_, err := broker.DecodeEventToken(tok)
		if !errors.Is(err, broker.ErrBadEventToken) || !strings.Contains(err.Error(), why) || !strings.HasPrefix(err.Error(), "tide: ") {
			t.Errorf("token %q: error %v, want ErrBadEventToken saying %q", tok, err, why)
		}
	}
}

// FuzzDecodeEventToken: no input makes DecodeEventToken panic, and what it
// accepts encodes back to an equal token.
func FuzzDecodeEventToken(f *testing.F) {
	f.Add(broker.EncodeEventToken([]broker.EventPosition{{Queue: "q", Seq: 5}, {Queue: "r", Partition: 3, Skip: 1, Seq: 2}}))
	f.Add("e1")
	f.Fuzz(func(t *testing.T, tok string) {
		ps, err := broker.DecodeEventToken(tok)
		if err != nil {
			return
		}
		again, err := broker.DecodeEventToken(broker.EncodeEventToken(ps))
		if err != nil || !slices.Equal(again, ps) {
			t.Fatalf("re-encoding %+v: %+v, %v", ps, again, err)
		}
	})
}
