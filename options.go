package tide

import (
	"fmt"
	"time"

	"github.com/tidequeue/tide/broker"
)

// Limits that Enqueue enforces. A task over a limit is rejected with an error
// wrapping ErrInvalidTask that names the limit.
const (
	// MaxPayloadSize is the largest payload Enqueue accepts, in bytes (4 MiB).
	MaxPayloadSize = 4 << 20
	// MaxHeadersSize is the largest total size of a task's header keys and
	// values, in bytes (64 KiB).
	MaxHeadersSize = 64 << 10
	// MaxDelay is the furthest in the future a task may be scheduled (10 years).
	MaxDelay = 10 * 365 * 24 * time.Hour
	// MaxRetryLimit is the largest MaxRetry accepted.
	MaxRetryLimit = 10000
	// MaxIDLength is the longest task ID, type or queue name accepted, in bytes.
	MaxIDLength = 256
)

// DefaultMaxRetry is the number of retries a task gets when MaxRetry is not given.
const DefaultMaxRetry = 25

// DefaultQueue is the queue a task goes to when Queue is not given.
const DefaultQueue = "default"

// Option configures how a task is enqueued. Options given to NewTask are
// defaults; options given to Enqueue override them. An Option is immutable and
// safe to share between goroutines.
type Option interface {
	apply(*enqueueOptions) error
}

type optionFunc func(*enqueueOptions) error

func (f optionFunc) apply(o *enqueueOptions) error { return f(o) }

type enqueueOptions struct {
	queue     string
	id        string
	maxRetry  int
	processAt time.Time // zero: now
	processIn time.Duration
	hasIn     bool
	timeout   time.Duration
	deadline  time.Time
	uniqueTTL time.Duration
	idemKey   string
	retention time.Duration
	replicas  int
	waitFor   time.Duration
	group     string
	replace   bool
	notify    string // NotifyURL
}

// Group puts the task in group key of its queue: a tenant, a customer, an
// account. Groups that have tasks ready are served round-robin, so a group
// with a million tasks waiting never starves one with ten, and the queue's
// group limits (QueueLimits.GroupConcurrency, GroupRate, Ordered) apply to
// each group on its own. Tasks without a group are served as one group.
//
// The key is 1 to 128 bytes without control characters or braces. A
// group's tasks are kept together (in one partition of the queue). TaskID
// takes any ID: "order-42" in group "acme" is found, cancelled and deleted
// as "order-42", and is the queue's one task with that ID whatever its
// group (another group's task with it is ErrTaskIDConflict; with Replace it
// moves to this group). On a queue of several partitions the Redis broker
// finds such a task through a pointer in its ID's partition: Replace then
// moves a task only to a group of the same partition (else
// ErrTaskIDConflict), and while the queue is repartitioned such IDs are
// refused (ErrInvalidTask); an ID that carries the group as its tag,
// "order-42{acme}", needs no pointer. Unique makes a task unique within
// its group.
func Group(key string) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if err := broker.CheckGroup(key); err != nil {
			return err
		}
		o.group = key
		return nil
	})
}

// Replace, with TaskID, makes Enqueue replace a waiting task (pending,
// scheduled or retry) that has the ID instead of failing with
// ErrTaskIDConflict: the task takes the new payload, headers, options and
// due time, and keeps its place in its group's order. This debounces: the
// task runs once, after the last Enqueue's delay. A finished task with the
// ID (completed, archived) is replaced by the new one, which is a new task:
// in its group it comes after the tasks enqueued before it. A task that is
// running still gets ErrTaskIDConflict. Without TaskID, Enqueue refuses
// Replace.
func Replace() Option {
	return optionFunc(func(o *enqueueOptions) error {
		o.replace = true
		return nil
	})
}

// ProcessIn delays the task by d from the moment of Enqueue. d must be
// between 0 and MaxDelay.
func ProcessIn(d time.Duration) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if d < 0 {
			return fmt.Errorf("ProcessIn(%v): negative delay", d)
		}
		if d > MaxDelay {
			return fmt.Errorf("ProcessIn(%v): delay over the %v limit", d, MaxDelay)
		}
		o.processIn, o.hasIn, o.processAt = d, true, time.Time{}
		return nil
	})
}

// ProcessAt makes the task due at t. A time in the past means now; a time
// more than MaxDelay ahead, or the zero time, is rejected.
func ProcessAt(t time.Time) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if t.IsZero() {
			return fmt.Errorf("ProcessAt: zero time")
		}
		if time.Until(t) > MaxDelay {
			return fmt.Errorf("ProcessAt(%s): more than %v ahead", t.Format(time.RFC3339), MaxDelay)
		}
		o.processAt, o.hasIn = t, false
		return nil
	})
}

// Queue sends the task to the named queue (default "default"). A name is 1 to
// MaxIDLength bytes of letters, digits and . _ - :
func Queue(name string) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if err := ValidateQueueName(name); err != nil {
			return err
		}
		o.queue = name
		return nil
	})
}

// MaxRetry sets how many times a failed task is retried before it is
// archived (default DefaultMaxRetry). 0 means no retry.
func MaxRetry(n int) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if n < 0 || n > MaxRetryLimit {
			return fmt.Errorf("MaxRetry(%d): must be between 0 and %d", n, MaxRetryLimit)
		}
		o.maxRetry = n
		return nil
	})
}

// TaskID sets the task's ID (default: a random UUID). Enqueue returns
// ErrTaskIDConflict while the queue holds a task with that ID in any state,
// which makes the ID a natural idempotency key ("order-cancel:42").
// An ID is 1 to MaxIDLength bytes with no control characters, and does not
// begin with ReservedIDPrefix ("tide:"), which names tide's own tasks.
func TaskID(id string) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if err := validateName("TaskID", id); err != nil {
			return err
		}
		if err := checkReservedID(id); err != nil {
			return err
		}
		o.id = id
		return nil
	})
}

// Timeout bounds each attempt: the handler's context is cancelled d after the
// attempt starts. 0 (the default) means no per-attempt timeout.
func Timeout(d time.Duration) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if d < 0 {
			return fmt.Errorf("Timeout(%v): negative", d)
		}
		o.timeout = d
		return nil
	})
}

// Deadline bounds every attempt by an absolute time: the handler's context is
// cancelled at t. The zero time is rejected.
func Deadline(t time.Time) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if t.IsZero() {
			return fmt.Errorf("Deadline: zero time")
		}
		o.deadline = t
		return nil
	})
}

// Unique refuses (with ErrDuplicateTask) a second task with the same queue,
// type and payload while the first is unfinished or until ttl has passed,
// whichever comes first. The lock is released when the task finishes in any
// way (done, archived, deleted). ttl must be at least one second.
func Unique(ttl time.Duration) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if ttl < time.Second {
			return fmt.Errorf("Unique(%v): ttl must be at least 1s", ttl)
		}
		o.uniqueTTL = ttl
		return nil
	})
}

// MaxIdempotencyKey is the longest key IdempotencyKey accepts, in bytes.
const MaxIdempotencyKey = 255

// IdempotencyKey makes Enqueue idempotent under key: an Enqueue into the
// same queue with the same key within the broker's idempotency window
// (redisbroker.WithIdempotencyWindow, default 24 hours) stores nothing and
// succeeds with the first task's ID, even after that task finished. Use it
// where a caller may repeat a request (an HTTP handler a client retries, a
// relay out of a database table). Unlike Unique, the key outlives the task
// and the repeat is not an error. The key is 1 to MaxIdempotencyKey bytes.
// On a queue with several partitions, two requests with one key but
// different TaskIDs are not compared, and a Repartition starts the keys
// afresh (docs/design.md, "Idempotency keys").
func IdempotencyKey(key string) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if key == "" || len(key) > MaxIdempotencyKey {
			return fmt.Errorf("IdempotencyKey: %d bytes, want 1 to %d", len(key), MaxIdempotencyKey)
		}
		o.idemKey = key
		return nil
	})
}

// Retention keeps a successfully processed task as StateCompleted, with its
// result, for d. The default 0 deletes it at once.
func Retention(d time.Duration) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if d < 0 {
			return fmt.Errorf("Retention(%v): negative", d)
		}
		o.retention = d
		return nil
	})
}

// ValidateQueueName reports whether name is a valid queue name: 1 to
// MaxIDLength bytes of ASCII letters, digits and . _ - :
// The error wraps ErrInvalidTask.
func ValidateQueueName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty queue name", ErrInvalidTask)
	}
	if len(name) > MaxIDLength {
		return fmt.Errorf("%w: queue name is %d bytes, over the %d limit", ErrInvalidTask, len(name), MaxIDLength)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':' {
			continue
		}
		return fmt.Errorf("%w: queue name %q has invalid character %q at byte %d (allowed: letters, digits, . _ - :)", ErrInvalidTask, name, c, i)
	}
	return nil
}

// validateName checks task IDs and types: non-empty, bounded, no control
// characters (valid UTF-8 is not required: IDs are opaque bytes).
func validateName(what, s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty %s", ErrInvalidTask, what)
	}
	if len(s) > MaxIDLength {
		return fmt.Errorf("%w: %s is %d bytes, over the %d limit", ErrInvalidTask, what, len(s), MaxIDLength)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return fmt.Errorf("%w: %s %q has a control character at byte %d", ErrInvalidTask, what, s, i)
		}
	}
	return nil
}

// WaitForReplicas makes Enqueue wait until n replicas of the Redis primary
// hold the task, for at most timeout, and fail with ErrNotReplicated
// otherwise. Redis replicates asynchronously: without this option a task
// acknowledged by Enqueue can be lost if the primary dies before replicating
// it (see docs/design.md, Replication). The task is stored either way;
// on ErrNotReplicated it is most likely safe, just not confirmed. n must be
// 1 to 16 and timeout positive. Brokers without replicas (membroker) ignore it.
func WaitForReplicas(n int, timeout time.Duration) Option {
	return optionFunc(func(o *enqueueOptions) error {
		if n < 1 || n > 16 {
			return fmt.Errorf("WaitForReplicas(%d, %v): n must be 1 to 16", n, timeout)
		}
		if timeout <= 0 {
			return fmt.Errorf("WaitForReplicas(%d, %v): timeout must be positive", n, timeout)
		}
		o.replicas, o.waitFor = n, timeout
		return nil
	})
}
