package webhook

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidequeue/tide/internal/outbound"
)

func TestSignVerify(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	body := []byte(`{"order":42}`)
	now := time.Unix(1_700_000_000, 0)
	sig := Sign(secret, now, body)
	if !strings.HasPrefix(sig, "t=1700000000,v1=") || len(sig) != len("t=1700000000,v1=")+64 {
		t.Fatalf("Sign = %q", sig)
	}
	if err := verifyAt(secret, sig, body, time.Minute, now.Add(30*time.Second)); err != nil {
		t.Fatalf("verify genuine: %v", err)
	}
	other := Sign([]byte("another secret, rotated out....."), now, body)
	rotated := other + "," + strings.Split(sig, ",")[1]
	if err := verifyAt(secret, rotated, body, time.Minute, now); err != nil {
		t.Fatalf("verify with two v1 values: %v", err)
	}
	if err := verifyAt(secret, sig+",v2=abc,x=1", body, time.Minute, now); err != nil {
		t.Fatalf("unknown keys must be ignored: %v", err)
	}

	cases := []struct {
		name    string
		secret  []byte
		header  string
		body    []byte
		now     time.Time
		want    string
		expired bool
	}{
		{"empty header", secret, "", body, now, "no Tide-Signature header", false},
		{"wrong secret", []byte("wrong secret wrong secret......"), sig, body, now, "no v1 signature matches", false},
		{"changed body", secret, sig, []byte(`{"order":43}`), now, "no v1 signature matches", false},
		{"too old", secret, sig, body, now.Add(6 * time.Minute), "outside the tolerance", true},
		{"from the future", secret, sig, body, now.Add(-6 * time.Minute), "outside the tolerance", true},
		{"no t", secret, strings.Split(sig, ",")[1], body, now, "no t=", false},
		{"no v1", secret, "t=1700000000", body, now, "no v1= signature", false},
		{"two t", secret, "t=1,t=2," + strings.Split(sig, ",")[1], body, now, "more than one t=", false},
		{"bad t", secret, "t=abc," + strings.Split(sig, ",")[1], body, now, "not a Unix time", false},
		{"signed t", secret, "t=+1700000000," + strings.Split(sig, ",")[1], body, now, "not a Unix time", false},
		{"garbage", secret, "hello", body, now, "without '='", false},
		{"empty secret", nil, sig, body, now, "empty secret", false},
		{"huge header", secret, sig + strings.Repeat(",v1=00", 1000), body, now, "over 4096", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := verifyAt(c.secret, c.header, c.body, 0, c.now)
			if !errors.Is(err, ErrInvalidSignature) {
				t.Fatalf("err = %v, want ErrInvalidSignature", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %q, want it to mention %q", err, c.want)
			}
			if errors.Is(err, ErrSignatureExpired) != c.expired {
				t.Errorf("errors.Is(err, ErrSignatureExpired) = %v, want %v", !c.expired, c.expired)
			}
			if strings.Contains(err.Error(), string(c.secret)) && len(c.secret) > 0 {
				t.Errorf("error leaks the secret: %v", err)
			}
		})
	}
}

func TestVerifyUsesTheClock(t *testing.T) {
	secret := []byte("0123456789abcdef")
	if err := Verify(secret, Sign(secret, time.Now(), nil), nil, 0); err != nil {
		t.Fatalf("Verify(now): %v", err)
	}
	if err := Verify(secret, Sign(secret, time.Now().Add(-time.Hour), nil), nil, 0); !errors.Is(err, ErrSignatureExpired) {
		t.Fatalf("Verify(an hour ago) = %v, want ErrSignatureExpired", err)
	}
	if err := Verify(secret, Sign(secret, time.Now().Add(-time.Hour), nil), nil, 2*time.Hour); err != nil {
		t.Fatalf("Verify(an hour ago, tolerance 2h) = %v", err)
	}
}

func FuzzVerify(f *testing.F) {
	secret := []byte("0123456789abcdef")
	now := time.Unix(1_700_000_000, 0)
	f.Add(Sign(secret, now, []byte("body")), []byte("body"))
	f.Add("t=1700000000,v1=zz", []byte(""))
	f.Add("t=,v1=", []byte("x"))
	f.Add(" t = 1 , v1 = 00 ", []byte("x"))
	f.Add("t=99999999999999999999,v1=00", []byte("x"))
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		err := verifyAt(secret, header, body, time.Minute, now)
		if err == nil {
			// Accepted: the header must hold the genuine signature of its t.
			var ts string
			for part := range strings.SplitSeq(header, ",") {
				if k, v, _ := strings.Cut(strings.TrimSpace(part), "="); k == "t" {
					ts = v
				}
			}
			if !strings.Contains(strings.ToLower(header), hex.EncodeToString(outbound.MAC(secret, ts, body))) {
				t.Fatalf("accepted header %q without the genuine signature", header)
			}
			return
		}
		if !errors.Is(err, ErrInvalidSignature) {
			t.Fatalf("error %v does not wrap ErrInvalidSignature", err)
		}
		if len(err.Error()) > 400 {
			t.Fatalf("error message is %d bytes", len(err.Error()))
		}
	})
}
