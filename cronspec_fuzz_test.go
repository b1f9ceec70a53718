package tide

import (
	"testing"
	"time"
)

// FuzzParseCronSpec: any spec string is either rejected with an error or
// yields a schedule whose next tick is in the future; parsing never panics.
func FuzzParseCronSpec(f *testing.F) {
	for _, s := range []string{"* * * * *", "*/5 * * * * *", "@every 30s", "@daily", "CRON_TZ=Europe/Berlin 0 9 * * MON-FRI", "TZ=", "CRON_TZ=UTC", "0 0 30 2 *", "@every -1s", "61 * * * *"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		c, _, err := parseCronSpec(spec, time.UTC)
		if err != nil {
			return
		}
		now := time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)
		if next := c.Next(now); !next.IsZero() && !next.After(now) {
			t.Fatalf("%q: next tick %v is not after %v", spec, next, now)
		}
	})
}
