// Package chaos holds the chaos tests of tide. They run servers as separate
// processes against a Redis behind the fault-injection proxy
// (internal/faultproxy), SIGKILL and SIGSTOP them, restart Redis, cut the
// network and delay and drop replies so that go-redis re-sends commands,
// then check that no task was lost, that no re-sent request doubled one, and
// that the duplicates kills and pauses cause stay within what the
// at-least-once contract allows.
package chaos
