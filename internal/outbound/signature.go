package outbound

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader is the header a signed request carries: "t=<unix
// seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">".
const SignatureHeader = "Tide-Signature"

// DefaultTolerance is how far a signature's timestamp may be from the
// receiver's clock when VerifyAt is given no tolerance.
const DefaultTolerance = 5 * time.Minute

// maxSignatureHeader bounds the header VerifyAt parses.
const maxSignatureHeader = 4096

// Errors VerifyAt returns (wrapped, with the detail).
var (
	// ErrInvalidSignature is wrapped by every error of VerifyAt.
	ErrInvalidSignature = errors.New("tide: webhook: invalid signature")
	// ErrSignatureExpired is wrapped, with ErrInvalidSignature, when the
	// signature matches but its timestamp is outside the tolerance.
	ErrSignatureExpired = errors.New("tide: webhook: signature timestamp outside the tolerance")
)

// Sign returns the value of SignatureHeader for body signed with secret at
// time t: "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">". It is
// the one place that signature is made.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(MAC(secret, ts, body))
}

// MAC returns the HMAC-SHA256 of "<ts>.<body>" under secret.
func MAC(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// VerifyAt checks a SignatureHeader value against the raw body at time
// now: one of its v1 signatures must be MAC(secret, t, body) (compared in
// constant time) and t within tolerance of now (DefaultTolerance when
// tolerance is 0 or negative). Unknown keys are ignored. The error wraps
// ErrInvalidSignature, and also ErrSignatureExpired for a genuine but stale
// signature; it never includes the secret or the expected signature.
func VerifyAt(secret []byte, header string, body []byte, tolerance time.Duration, now time.Time) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: empty secret", ErrInvalidSignature)
	}
	if header == "" {
		return fmt.Errorf("%w: no %s header", ErrInvalidSignature, SignatureHeader)
	}
	if len(header) > maxSignatureHeader {
		return fmt.Errorf("%w: header is %d bytes, over %d", ErrInvalidSignature, len(header), maxSignatureHeader)
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return fmt.Errorf("%w: malformed header: element without '='", ErrInvalidSignature)
		}
		switch k {
		case "t":
			if ts != "" {
				return fmt.Errorf("%w: malformed header: more than one t=", ErrInvalidSignature)
			}
			if v == "" {
				return fmt.Errorf("%w: malformed header: empty t=", ErrInvalidSignature)
			}
			ts = v
		case "v1":
			s, err := hex.DecodeString(v)
			if err != nil || len(s) != sha256.Size {
				continue // not a v1 signature we could have made; another may match
			}
			sigs = append(sigs, s)
		}
	}
	if ts == "" {
		return fmt.Errorf("%w: malformed header: no t=", ErrInvalidSignature)
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || ts[0] < '0' || ts[0] > '9' {
		return fmt.Errorf("%w: malformed header: t= is not a Unix time in seconds", ErrInvalidSignature)
	}
	if len(sigs) == 0 {
		return fmt.Errorf("%w: malformed header: no v1= signature", ErrInvalidSignature)
	}
	want := MAC(secret, ts, body)
	match := false
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			match = true
		}
	}
	if !match {
		return fmt.Errorf("%w: no v1 signature matches the body (wrong secret, or the body was changed: verify the raw bytes, before parsing)", ErrInvalidSignature)
	}
	n, lim := now.Unix(), int64(tolerance/time.Second)
	if unix > n+lim || unix < n-lim {
		return fmt.Errorf("%w: %w: signed at %d, %d s from now; the tolerance is %v", ErrInvalidSignature, ErrSignatureExpired, unix, n-unix, tolerance)
	}
	return nil
}
