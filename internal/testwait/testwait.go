// Package testwait waits in tests for a state to be reached.
//
// A test that needs something to have happened elsewhere (a worker ran a
// task, a server started listening, a record expired) polls for that state
// with For or Until instead of sleeping for a guessed time: it goes on as
// soon as the state holds, and the timeout is only a bound that stops a hung
// test, so it can be generous on a loaded machine.
package testwait

import (
	"testing"
	"time"
)

// Poll intervals: the condition is checked again after firstPoll, then the
// pause doubles up to maxPoll, so a state reached quickly is seen quickly
// and a slow one (each check may be a round trip to Redis) is not polled in
// a busy loop.
const (
	firstPoll = time.Millisecond
	maxPoll   = 10 * time.Millisecond
)

// For calls cond until it returns true and then returns. If cond still
// returns false once timeout has passed, For fails t with t.Fatalf, naming
// what it waited for and the timeout, and returns.
//
// cond is called at least once, even with a timeout of zero or less, and
// never again after it returned true. Between calls For sleeps, starting at
// a millisecond and doubling up to 10 milliseconds. cond may call t.Fatal
// itself.
//
// Like t.Fatalf, For must be called from the goroutine running the test.
func For(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Until is For for a check that says what is still missing: it calls check
// until it returns nil. If check still returns an error once timeout has
// passed, Until fails t with t.Fatalf, naming the timeout and the last
// error, and returns. It polls as For does, under the same rules.
func Until(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	var err error
	if !poll(timeout, func() bool { err = check(); return err == nil }) {
		t.Fatalf("timed out after %v: %v", timeout, err)
	}
}

// poll calls cond until it returns true (reporting true) or timeout has
// passed (reporting false).
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	pause := firstPoll
	for !cond() {
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, maxPoll)
	}
	return true
}
