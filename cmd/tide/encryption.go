package main

import (
	"fmt"
	"strings"

	"github.com/tidequeue/tide/encrypt"
)

// encryptionHelp documents --encryption-keys, for the help texts of the
// commands that take it.
const encryptionHelp = `Payloads and results encrypted with encrypt.Wrap are shown (and, by serve,
written) in plaintext with --encryption-keys or TIDE_ENCRYPTION_KEYS: the
keys of your processes, "ID:BASE64SECRET" entries separated by commas, the
first one encrypting (see the encrypt package). Prefer the environment
variable: flags show in 'ps'. Without the keys an encrypted value is shown
as "(encrypted: N bytes; ...)"; with keys that do not open it, as "(not
decrypted: ...)" and the reason heads the last error.`

// encryptionKeys reads --encryption-keys, else TIDE_ENCRYPTION_KEYS, into
// a.keys. A bad list is a usage error that names the entry and the problem
// and never repeats the text, which holds secrets.
func (a *app) encryptionKeys(o *cmdOpts) error {
	src, s := "--encryption-keys", o.encKeys
	if strings.TrimSpace(s) == "" {
		src, s = "TIDE_ENCRYPTION_KEYS", a.env("TIDE_ENCRYPTION_KEYS")
	}
	if strings.TrimSpace(s) == "" {
		return nil
	}
	keys, err := encrypt.ParseKeys(s)
	if err != nil {
		return usagef(o.cmd, "%s: %s (a key is ID:BASE64SECRET with 32 bytes of secret; generate one with: echo \"1:$(openssl rand -base64 32)\")",
			src, strings.TrimPrefix(err.Error(), "encrypt: "))
	}
	a.keys = keys
	return nil
}

// undecrypted reports whether the field ("payload" or "result") of a task
// read through encrypt.Wrap did not decrypt: the wrapper then returns it
// empty and puts the reason at the head of the last error.
func undecrypted(field string, v []byte, lastErr string) bool {
	return len(v) == 0 && strings.Contains(lastErr, "encrypt: cannot decrypt "+field)
}

// showValue renders a payload or result for people, saying so when it is
// encrypted and cannot be shown.
func (a *app) showValue(field string, v []byte, lastErr string) string {
	switch {
	case encrypt.IsSealed(v) && len(a.keys) == 0:
		return fmt.Sprintf("(encrypted: %s; pass --encryption-keys or set TIDE_ENCRYPTION_KEYS to see it)", plural(len(v), "byte", "bytes"))
	case encrypt.IsSealed(v):
		return fmt.Sprintf("(encrypted: %s, not decrypted)", plural(len(v), "byte", "bytes"))
	case len(a.keys) > 0 && undecrypted(field, v, lastErr):
		return "(not decrypted with the keys given: see the last error)"
	}
	return showBytes(v)
}
