package encrypt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
)

// SecretSize is the length of a key's secret: AES-256 takes 32 bytes.
const SecretSize = 32

// Key is one AES-256 key. Its ID (1 to 255) is stored in the header of every
// value it encrypts, so that after a rotation each value is opened with the
// key that sealed it. Secret is 32 random bytes (for example the output of
// `openssl rand -base64 32`, decoded).
//
// Formatting a Key with the fmt package or slog never shows the secret.
type Key struct {
	ID     byte
	Secret []byte
}

// String returns "encrypt.Key{ID: 3, Secret: <redacted>}".
func (k Key) String() string {
	return "encrypt.Key{ID: " + strconv.Itoa(int(k.ID)) + ", Secret: <redacted>}"
}

// Format makes every fmt verb (%v, %+v, %#v, %x, %d, ...) print String, so
// that a key printed by mistake does not show its secret.
func (k Key) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(k.String())) }

// LogValue makes slog show the key's ID only.
func (k Key) LogValue() slog.Value {
	return slog.GroupValue(slog.Int("id", int(k.ID)), slog.String("secret", "<redacted>"))
}

// ParseKeys parses a key list as it is kept in an environment variable or a
// command-line flag: comma-separated entries "ID:SECRET", where ID is 1 to 255
// and SECRET the base64 form (standard or URL alphabet, padded or not) of 32
// bytes. The first entry encrypts, the others only decrypt:
//
//	TIDE_ENCRYPTION_KEYS="2:q0sV...c=,1:7Jm1...w="
//
// Spaces around entries are ignored. An error names the entry by position
// (and by ID once that is parsed) and never repeats any of the input, which
// may hold secrets.
func ParseKeys(s string) ([]Key, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("encrypt: no keys: want comma-separated ID:BASE64SECRET entries")
	}
	entries := strings.Split(s, ",")
	keys := make([]Key, 0, len(entries))
	seen := map[byte]int{}
	for i, e := range entries {
		pos := fmt.Sprintf("entry %d of %d", i+1, len(entries))
		e = strings.TrimSpace(e)
		if e == "" {
			return nil, fmt.Errorf("encrypt: key list: %s is empty", pos)
		}
		idText, secretText, ok := strings.Cut(e, ":")
		if !ok {
			return nil, fmt.Errorf("encrypt: key list: %s has no ':'; want ID:BASE64SECRET", pos)
		}
		id, err := strconv.ParseUint(strings.TrimSpace(idText), 10, 8)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("encrypt: key list: %s: the key ID is not a number from 1 to 255", pos)
		}
		pos = fmt.Sprintf("%s (key %d)", pos, id)
		if j, dup := seen[byte(id)]; dup {
			return nil, fmt.Errorf("encrypt: key list: %s: key ID %d is already used by entry %d", pos, id, j)
		}
		seen[byte(id)] = i + 1
		secret, ok := decodeSecret(strings.TrimSpace(secretText))
		if !ok {
			return nil, fmt.Errorf("encrypt: key list: %s: the secret is not valid base64", pos)
		}
		if len(secret) != SecretSize {
			return nil, fmt.Errorf("encrypt: key list: %s: the secret is %d bytes, want %d", pos, len(secret), SecretSize)
		}
		keys = append(keys, Key{ID: byte(id), Secret: secret})
	}
	return keys, nil
}

// decodeSecret accepts the four common base64 forms.
func decodeSecret(s string) ([]byte, bool) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, true
		}
	}
	return nil, false
}

// keyring holds the AEADs of a Wrap: the first key seals, every key opens.
type keyring struct {
	enc   *sealKey // the first key
	byID  [256]*sealKey
	ids   string // "2, 1": the IDs in order, for error messages
	count int
	// digest keys the digest a workflow is stored with (flowDigest): an
	// HMAC key derived from the first key's secret, never the secret.
	digest []byte
}

type sealKey struct {
	id   byte
	aead cipher.AEAD // AES-256-GCM with random 96-bit nonces
}

func newKeyring(keys []Key) (*keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("encrypt: no keys: Wrap needs at least one key")
	}
	kr := &keyring{count: len(keys)}
	ids := make([]string, len(keys))
	for i, k := range keys {
		switch {
		case k.ID == 0:
			return nil, fmt.Errorf("encrypt: key %d of %d has ID 0; IDs are 1 to 255", i+1, len(keys))
		case len(k.Secret) != SecretSize:
			return nil, fmt.Errorf("encrypt: key %d: the secret is %d bytes, want %d", k.ID, len(k.Secret), SecretSize)
		case kr.byID[k.ID] != nil:
			return nil, fmt.Errorf("encrypt: key ID %d is given twice", k.ID)
		}
		// aes.NewCipher copies the secret into its key schedule: later
		// changes to k.Secret (a caller zeroing it) change nothing here.
		block, err := aes.NewCipher(k.Secret)
		if err != nil {
			return nil, fmt.Errorf("encrypt: key %d: %v", k.ID, err)
		}
		aead, err := cipher.NewGCMWithRandomNonce(block)
		if err != nil {
			return nil, fmt.Errorf("encrypt: key %d: %v", k.ID, err)
		}
		sk := &sealKey{id: k.ID, aead: aead}
		kr.byID[k.ID] = sk
		if i == 0 {
			kr.enc = sk
			m := hmac.New(sha256.New, k.Secret)
			m.Write([]byte("tide: workflow digest key, v1"))
			kr.digest = m.Sum(nil)
		}
		ids[i] = strconv.Itoa(int(k.ID))
	}
	kr.ids = strings.Join(ids, ", ")
	return kr, nil
}
