package encrypt

import (
	"encoding/binary"
	"fmt"
)

// A sealed value is
//
//	0xFF 'T' 'E'   magic: marks the value as sealed (0xFF never occurs in
//	               UTF-8 text, so no text or JSON payload starts with it)
//	version        1
//	key ID         1..255: the key that sealed it
//	binding        'I': bound to the task ID, 'U': bound to the unique key
//	nonce          12 random bytes
//	ciphertext     as long as the plaintext
//	tag            16 bytes (GCM)
//
// 34 bytes more than the plaintext. The associated data authenticated with
// it is the 6 header bytes, the field ('P' payload, 'R' result), the queue
// and the task ID or unique key (see binding), so a value opens only as the
// same field of the same task of the same queue, and only with the header it
// was sealed with.
const (
	magic0, magic1, magic2 = 0xFF, 'T', 'E'
	version1               = 1
	headerSize             = 6
	nonceSize              = 12
	tagSize                = 16

	bindID     = 'I'
	bindUnique = 'U'

	fieldPayload = 'P'
	fieldResult  = 'R'
	fieldStep    = 'S' // a durable record's data: a step's result, a signal's payload
)

// Overhead is how many bytes encryption adds to a payload or result: the
// 6-byte header, the 12-byte nonce and the 16-byte GCM tag.
const Overhead = 34

// The sizes add up, or this does not compile.
var _ = [1]struct{}{}[Overhead-(headerSize+nonceSize+tagSize)]

// IsSealed reports whether v is a value sealed by a wrapped broker: it
// starts with the magic bytes 0xFF 'T' 'E' (see Format; no UTF-8 text or
// JSON starts with 0xFF). Tools that show stored payloads use it to say
// "encrypted" instead of printing ciphertext. It is safe for concurrent use.
func IsSealed(v []byte) bool {
	return len(v) >= 3 && v[0] == magic0 && v[1] == magic1 && v[2] == magic2
}

func fieldName(field byte) string {
	switch field {
	case fieldResult:
		return "result"
	case fieldStep:
		return "step data"
	}
	return "payload"
}

// where identifies the value being sealed or opened: its field, its queue
// and the task's ID and unique key.
type where struct {
	field     byte
	queue     string
	id        string
	uniqueKey string
}

// ad returns the associated data of a value with header h.
func (w where) ad(h []byte) []byte {
	bound := w.id
	if h[5] == bindUnique {
		bound = w.uniqueKey
	}
	ad := make([]byte, 0, headerSize+1+binary.MaxVarintLen64+len(w.queue)+len(bound))
	ad = append(ad, h[:headerSize]...)
	ad = append(ad, w.field)
	ad = binary.AppendUvarint(ad, uint64(len(w.queue)))
	ad = append(ad, w.queue...)
	return append(ad, bound...)
}

// seal encrypts plain as the value at w with the first key, bound to the
// task ID or, when bind is bindUnique, to the unique key.
func (kr *keyring) seal(w where, bind byte, plain []byte) []byte {
	k := kr.enc
	out := make([]byte, headerSize, Overhead+len(plain))
	out[0], out[1], out[2], out[3], out[4], out[5] = magic0, magic1, magic2, version1, k.id, bind
	return k.aead.Seal(out, nil, plain, w.ad(out))
}

// openError says why a sealed value did not open. Its message is meant for
// LastErr and logs: it names the field and the cause, never the data.
type openError struct {
	field byte
	cause string
}

func (e *openError) Error() string {
	return "encrypt: cannot decrypt " + fieldName(e.field) + ": " + e.cause
}

// open returns the plaintext of the value v at w: v itself when it is not
// sealed (written before encryption was turned on), the decrypted bytes when
// it opens, and an *openError otherwise. It never panics, whatever v holds.
func (kr *keyring) open(w where, v []byte) ([]byte, error) {
	if !IsSealed(v) {
		return v, nil
	}
	fail := func(format string, a ...any) ([]byte, error) {
		return nil, &openError{field: w.field, cause: fmt.Sprintf(format, a...)}
	}
	if len(v) < headerSize {
		return fail("the value is truncated (%d bytes)", len(v))
	}
	if v[3] != version1 {
		return fail("unsupported format version %d (this build reads version %d)", v[3], version1)
	}
	if v[5] != bindID && v[5] != bindUnique {
		return fail("unknown binding %#02x", v[5])
	}
	k := kr.byID[v[4]]
	if k == nil {
		return fail("unknown key %d (this process has keys %s)", v[4], kr.ids)
	}
	if len(v) < Overhead {
		return fail("the value is truncated (%d bytes)", len(v))
	}
	plain, err := k.aead.Open(nil, nil, v[headerSize:], w.ad(v))
	if err != nil {
		return fail("authentication failed with key %d: the value was altered, copied from another task, or sealed with another key of that ID", v[4])
	}
	if plain == nil {
		plain = []byte{}
	}
	return plain, nil
}
