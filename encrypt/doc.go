// Package encrypt encrypts task payloads and results at rest.
//
// Wrap decorates any broker.Broker: payloads are sealed with AES-256-GCM
// before they reach the broker and opened when tasks come back, so the
// Client, Server, Inspector, dashboard and CLI work unchanged on the wrapped
// broker and handlers see plaintext:
//
//	keys, err := encrypt.ParseKeys(os.Getenv("TIDE_ENCRYPTION_KEYS")) // "1:BASE64SECRET"
//	...
//	b, err := encrypt.Wrap(redisbroker.New(rdb), keys...)
//	...
//	client := tide.NewClient(b)
//	srv := tide.NewServer(b, tide.Config{})
//	insp := tide.NewInspector(b)
//
// Every process that enqueues, processes or inspects tasks uses the same
// keys. A key is 32 random bytes, written in base64 with an ID from 1 to
// 255: generate one with
//
//	echo "1:$(openssl rand -base64 32)"
//
// # What is encrypted
//
// Payload and Result are encrypted. Everything else is stored as before, in
// plaintext: the task ID, queue and type, the Headers (tracing context must
// stay readable to tools that do not have the keys; do not put secrets in
// headers), LastErr (a handler's error text; do not quote payloads in
// errors), the unique key, times, states, counters, and the server and
// scheduler records. The length of a payload or result is not hidden (a
// sealed value is 34 bytes longer), and an empty value is stored as it is.
//
// The unique key of tide.Unique is an unkeyed digest of queue, type and
// payload: someone who reads it and can guess a payload (a small order
// number, an e-mail address) can confirm the guess. Avoid Unique for tasks
// whose payloads are both secret and guessable, or give them a TaskID that
// makes them unique instead.
//
// # Format
//
// A sealed value is a 6-byte header (the magic 0xFF 'T' 'E', format version
// 1, the ID of the key that sealed it, and what the value is bound to), a
// random 96-bit nonce, the ciphertext and the 16-byte GCM tag. The header,
// the field (payload or result), the queue and the task ID are authenticated
// as associated data: a value opens only as the same field of the same task,
// so a ciphertext copied into another task, another queue or from payload to
// result fails to decrypt, as does a value changed in any bit.
//
// # Task IDs
//
// A broker assigns the ID of a task enqueued without one inside Enqueue, but
// the payload must be sealed, bound to the ID, before Enqueue is called. The
// wrapper therefore draws the ID itself with broker.NewID, the brokers' own
// generator, and the broker keeps it as it keeps an ID a caller chose (the
// contract promises that). Should the drawn ID meet an existing task (about
// one in ten thousand among a billion live tasks), the wrapper reads that
// task: if it is another task it draws again, as the brokers do; if it
// cannot tell (the task is gone, or cannot be read), it reports
// broker.ErrTaskIDConflict rather than risk storing the task twice. The
// trade-off: to the broker the ID is the caller's, so such a conflict, which
// the broker would have resolved inside its script, costs an extra read and
// write, and while a queue is being repartitioned the Redis broker looks
// each new task's ID up in the old partitions (one more read per Enqueue).
// Binding to the queue and type alone would avoid both, but would let a
// ciphertext move between any two tasks of one type.
//
// The exception is a task with a unique key and no ID (tide.Unique without
// tide.TaskID): a broker with several partitions per queue must draw its ID
// in the partition of its lock, which only the broker knows (it changes
// while a queue is repartitioned). Its payload is bound to the queue and the
// unique key instead of the ID. A ciphertext can then be moved only to a
// task of the same queue with the same unique key, which for tide.Unique
// means the same type and payload. Results, written once the ID is known,
// and every value sealed again later (see Settle below) are bound to the ID.
//
// A settlement carries the delivered task, which a broker may write back
// (the Redis broker stores it for a completed task kept with Retention); the
// wrapper seals its payload again, with the current key and bound to the ID,
// so a kept task stays encrypted.
//
// # Values that do not decrypt
//
// A value that does not carry the magic was written before encryption was
// turned on (or by a process without keys) and is returned as it is. A value
// that carries it is never taken for plaintext (so an old binary payload
// that happens to begin with the bytes 0xFF 'T' 'E' reads as undecryptable;
// no UTF-8 text or JSON begins with 0xFF): when it does not decrypt
// (unknown key, unsupported version, altered, truncated or moved from another
// task), then
//
//   - Dequeue does not hand the task to a worker. It archives it at once,
//     with LastErr saying why, e.g. "encrypt: cannot decrypt payload: unknown
//     key 3 (this process has keys 2, 1)", and dequeues another task in its
//     place. The stored payload is left as it was: once the missing key is
//     configured, running the archived task again (Inspector.RunTask, the
//     dashboard, "tide tasks run") processes it normally. If that settlement
//     fails, the task's lease runs out and lease recovery brings it back.
//     A result that does not decrypt is dropped from the delivery (handlers
//     do not read results).
//   - GetTask and Admin.ListTasks (the Inspector, dashboard and CLI) return
//     the task with the value nil and the reason as the first line of
//     LastErr, followed by the task's own last error, if any, after "last
//     error: ".
//
// Nothing panics on malformed data.
//
// # Threat model
//
// Encryption protects payloads and results from those who can read what
// Redis holds or sends but do not have the keys: Redis replicas and their
// operators, RDB and AOF files, backups and snapshots, memory dumps of the
// Redis server, read-only Redis users, MONITOR and SLOWLOG output, and
// captures of unencrypted Redis traffic (values are sealed before they leave
// the process).
//
// It does not protect against anyone who has the keys, or can run code or
// read memory in a process that has them. Nor against someone with write
// access to Redis: they can delete, delay, reorder or replay tasks, enqueue
// tasks with plaintext payloads (which are read as plaintext, see above),
// or make tasks fail. The binding to the task only ensures that they cannot
// splice one task's encrypted payload into another. Metadata (see "What is
// encrypted") is not protected at all.
//
// # Rotating keys
//
// Keys rotate without downtime in two deployments, because a process can
// only decrypt with keys it has:
//
//  1. Add the new key everywhere, second: "1:OLD,2:NEW". Key 1 still
//     encrypts; every process can now decrypt values sealed with key 2.
//  2. When every process runs with both, put the new key first: "2:NEW,1:OLD".
//     New values are sealed with key 2.
//  3. Drop key 1 once no value sealed with it is left: tasks keep the
//     ciphertext they were enqueued with until they finish, so wait for the
//     longest of the scheduled delays, retries, Retention and the archive's
//     age limit (90 days by default), or delete those tasks.
//
// A process that meets a value of a key it lacks archives the task with an
// "unknown key" error (see above); configure the key and run the task again.
// Rotate keys well before 2^32 values have been sealed with one key (the
// limit of random 96-bit nonces).
//
// Turning encryption on follows the same order: first give every process
// that dequeues or inspects tasks the wrapped broker (it reads plaintext
// tasks as before), then the processes that enqueue. A process with a plain
// broker hands sealed payloads to its handlers as they are. There is no
// decrypt-only mode yet: a wrapped broker seals every payload and result it
// writes, so encryption cannot be turned off cleanly while sealed tasks
// remain.
package encrypt
