package encrypt

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func fuzzKeyring(t testing.TB) *keyring {
	t.Helper()
	k1, k2 := Key{ID: 1, Secret: bytes.Repeat([]byte{1}, SecretSize)}, Key{ID: 2, Secret: bytes.Repeat([]byte{2}, SecretSize)}
	kr, err := newKeyring([]Key{k2, k1})
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// FuzzOpen feeds arbitrary bytes, queues, IDs and unique keys to the
// decryption of stored values: it never panics; a value without the magic is
// returned as it is; a value with it either opens or fails with an
// "encrypt: cannot decrypt" error and no plaintext.
func FuzzOpen(f *testing.F) {
	kr := fuzzKeyring(f)
	at := where{field: fieldPayload, queue: "q", id: "id1", uniqueKey: "u"}
	good := kr.seal(at, bindID, []byte("hello"))
	uniq := kr.seal(at, bindUnique, []byte("hello"))
	for _, v := range [][]byte{
		nil, {}, {0xFF}, {0xFF, 'T'}, {0xFF, 'T', 'E'}, {0xFF, 'T', 'E', 1, 2, 'I'},
		good, uniq, good[:len(good)-1], good[:headerSize+nonceSize], []byte(`{"a":1}`),
	} {
		f.Add(v, "q", "id1", "u", false)
	}
	bad := bytes.Clone(good)
	bad[4] = 7
	f.Add(bad, "q", "id1", "u", true)
	f.Fuzz(func(t *testing.T, v []byte, queue, id, uniqueKey string, result bool) {
		w := where{field: fieldPayload, queue: queue, id: id, uniqueKey: uniqueKey}
		if result {
			w.field = fieldResult
		}
		orig := bytes.Clone(v)
		p, err := kr.open(w, v)
		if !bytes.Equal(v, orig) {
			t.Fatal("open changed its input")
		}
		if !IsSealed(v) {
			if err != nil || !bytes.Equal(p, v) {
				t.Fatalf("unsealed value: %q, %v; want it back unchanged", p, err)
			}
			return
		}
		if err != nil {
			var oe *openError
			if p != nil || !errors.As(err, &oe) || !strings.HasPrefix(err.Error(), "encrypt: cannot decrypt "+fieldName(w.field)+": ") {
				t.Fatalf("failed open: %q, %v", p, err)
			}
			return
		}
		if p == nil {
			t.Fatal("opened value is nil")
		}
	})
}

// FuzzRoundTrip: every plaintext seals and opens back to itself at the same
// place, and opens nowhere else; any change of one byte makes it fail.
func FuzzRoundTrip(f *testing.F) {
	kr := fuzzKeyring(f)
	f.Add([]byte("payload"), "q", "id", "u", false, uint16(0), byte(1))
	f.Add([]byte{}, "", "", "", true, uint16(40), byte(0x80))
	f.Fuzz(func(t *testing.T, plain []byte, queue, id, uniqueKey string, unique bool, pos uint16, flip byte) {
		w := where{field: fieldPayload, queue: queue, id: id, uniqueKey: uniqueKey}
		bind := byte(bindID)
		if unique {
			bind = bindUnique
		}
		v := kr.seal(w, bind, plain)
		if len(v) != len(plain)+Overhead || !IsSealed(v) || v[4] != 2 || v[5] != bind {
			t.Fatalf("sealed value: %d bytes, header % x", len(v), v[:headerSize])
		}
		p, err := kr.open(w, v)
		if err != nil || !bytes.Equal(p, plain) {
			t.Fatalf("open(seal(%q)) = %q, %v", plain, p, err)
		}
		elsewhere := []where{
			{field: fieldResult, queue: queue, id: id, uniqueKey: uniqueKey},
			{field: fieldPayload, queue: queue + "x", id: id, uniqueKey: uniqueKey},
		}
		if unique {
			elsewhere = append(elsewhere, where{field: fieldPayload, queue: queue, id: id + "x", uniqueKey: uniqueKey + "x"})
		} else {
			elsewhere = append(elsewhere, where{field: fieldPayload, queue: queue, id: id + "x", uniqueKey: uniqueKey})
		}
		for _, o := range elsewhere {
			if p, err := kr.open(o, v); err == nil {
				t.Fatalf("opened at %+v: %q", o, p)
			}
		}
		if flip != 0 {
			c := bytes.Clone(v)
			c[int(pos)%len(c)] ^= flip
			if p, err := kr.open(w, c); err == nil && IsSealed(c) {
				t.Fatalf("opened after changing byte %d: %q", int(pos)%len(c), p)
			}
		}
	})
}

// FuzzParseKeys: ParseKeys never panics, returns only usable keys, and its
// errors never repeat a secret of 8 characters or more.
func FuzzParseKeys(f *testing.F) {
	for _, s := range []string{
		"", "1:" + strings.Repeat("A", 43), "1:" + strings.Repeat("A", 44) + ",2:" + strings.Repeat("B", 43),
		"0:x", "256:x", "1:", ":", ",", "1:AAAA,1:AAAA", "x:" + strings.Repeat("Q", 43),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		keys, err := ParseKeys(s)
		if err != nil {
			if keys != nil {
				t.Fatal("keys with an error")
			}
			for e := range strings.SplitSeq(s, ",") {
				_, secret, _ := strings.Cut(e, ":")
				if secret = strings.TrimSpace(secret); len(secret) >= 8 && strings.Contains(err.Error(), secret) {
					t.Fatalf("error %q repeats the secret %q", err, secret)
				}
			}
			return
		}
		if _, err := newKeyring(keys); err != nil {
			t.Fatalf("ParseKeys(%q) returned keys Wrap refuses: %v", s, err)
		}
	})
}
