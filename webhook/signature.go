package webhook

import (
	"time"

	"github.com/tidequeue/tide/internal/outbound"
)

// DefaultTolerance is how far a signature's timestamp may be from the
// receiver's clock when Verify is given no tolerance.
const DefaultTolerance = outbound.DefaultTolerance

// Errors Verify returns (wrapped, with the detail).
var (
	// ErrInvalidSignature is wrapped by every error of Verify: a missing or
	// malformed header, a signature that does not match, or an expired one.
	ErrInvalidSignature = outbound.ErrInvalidSignature
	// ErrSignatureExpired is wrapped, with ErrInvalidSignature, when the
	// signature matches but its timestamp is outside the tolerance.
	ErrSignatureExpired = outbound.ErrSignatureExpired
)

// Sign returns the value of the Tide-Signature header for body signed with
// secret at time t: "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">".
// The handler, and a tide.Server for NotifyURL notifications
// (tide.Config.NotifySecret), sign every request this way; tests of
// receivers can call it to build requests.
func Sign(secret []byte, t time.Time, body []byte) string {
	return outbound.Sign(secret, t, body)
}

// Verify checks a Tide-Signature header value against the raw request body:
// one of its v1 signatures must be the HMAC-SHA256 of "<t>.<body>" under
// secret (compared in constant time), and t must be within tolerance of the
// current time (DefaultTolerance when tolerance is 0 or negative), which
// bounds how long a captured request can be replayed. Unknown keys in the
// header (future signature versions) are ignored. The error wraps
// ErrInvalidSignature, and also ErrSignatureExpired for a genuine but stale
// signature; it never includes the secret or the expected signature. It
// verifies webhook requests and NotifyURL notifications alike.
func Verify(secret []byte, header string, body []byte, tolerance time.Duration) error {
	return verifyAt(secret, header, body, tolerance, time.Now())
}

// verifyAt is Verify at the time now.
func verifyAt(secret []byte, header string, body []byte, tolerance time.Duration, now time.Time) error {
	return outbound.VerifyAt(secret, header, body, tolerance, now)
}
