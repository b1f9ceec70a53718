package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/tidequeue/tide/internal/redistest"
)

const want = `report: order 42 shipped with receipt-42
workflow fulfil-order-42 succeeded:
  charge   succeeded
  reserve  succeeded
  ship     succeeded after charge, reserve
  report   succeeded after ship
batch of 10: 8 imported, 2 failed
`

// The demo's output, in memory and on a real Redis.
func TestDemo(t *testing.T) {
	for name, addr := range map[string]string{"memory": "", "redis": redistest.Addr(t)} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if err := run(context.Background(), addr, &out); err != nil {
				t.Fatal(err)
			}
			if out.String() != want {
				t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
			}
		})
	}
}
