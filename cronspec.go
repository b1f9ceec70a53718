package tide

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/robfig/cron/v3"
)

// cronSchedule is a parsed spec: a robfig schedule read in loc, or (loc
// nil) an epoch-aligned @every.
type cronSchedule struct {
	s   cron.Schedule
	loc *time.Location
}

// Next returns the first tick after t, or the zero time when there is none
// within five years.
func (c cronSchedule) Next(t time.Time) time.Time {
	if c.loc == nil {
		return c.s.Next(t)
	}
	return c.s.Next(t.In(c.loc))
}

// Prev returns the latest tick at or before now, looking back at most
// lookback; ok is false when there is none. It costs O(log(lookback)) calls
// of Next: a doubling search for a window that holds a tick, then a
// bisection for the last time whose next tick is not after now.
func (c cronSchedule) Prev(now time.Time, lookback time.Duration) (tick time.Time, ok bool) {
	within := func(t time.Time) bool {
		n := c.Next(t)
		return !n.IsZero() && !n.After(now)
	}
	w := time.Second
	for !within(now.Add(-w)) {
		if w >= lookback {
			return time.Time{}, false
		}
		w = min(2*w, lookback)
	}
	// within(lo) holds and within(hi) does not (next(now) is after now).
	lo, hi := now.Add(-w), now
	for hi.Sub(lo) > time.Millisecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if within(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return c.Next(lo), true
}

// cronParser reads crontab lines of 5 or 6 fields (seconds optional) and
// descriptors.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// everySchedule is "@every d", aligned on the Unix epoch so that every
// process has the same ticks.
type everySchedule struct{ d time.Duration }

func (e everySchedule) Next(t time.Time) time.Time {
	d := int64(e.d / time.Second)
	sec := t.Unix()
	k := sec / d
	if sec < 0 && sec%d != 0 {
		k-- // floor
	}
	return time.Unix((k+1)*d, 0).UTC()
}

// parseCronSpec parses spec, read in def unless it has a CRON_TZ=/TZ=
// prefix. locName names the zone the schedule is read in ("" for @every).
func parseCronSpec(spec string, def *time.Location) (c cronSchedule, locName string, err error) {
	bad := func(format string, a ...any) (cronSchedule, string, error) {
		return cronSchedule{}, "", fmt.Errorf("tide: invalid cron spec %q: "+format, append([]any{spec}, a...)...)
	}
	rest := strings.TrimSpace(spec)
	if rest == "" {
		return bad("empty")
	}
	loc := def
	if strings.HasPrefix(rest, "TZ=") || strings.HasPrefix(rest, "CRON_TZ=") {
		eq := strings.IndexByte(rest, '=')
		sp := strings.IndexFunc(rest, unicode.IsSpace)
		if sp < 0 {
			return bad("time zone prefix without a schedule")
		}
		name := rest[eq+1 : sp]
		if name == "" {
			return bad("empty time zone")
		}
		if loc, err = time.LoadLocation(name); err != nil {
			return bad("time zone %q: %w", name, err)
		}
		rest = strings.TrimSpace(rest[sp:])
	}
	if d, ok := strings.CutPrefix(rest, "@every"); ok && (d == "" || unicode.IsSpace(rune(d[0]))) {
		dur, err := time.ParseDuration(strings.TrimSpace(d))
		switch {
		case err != nil:
			return bad("%w", err)
		case dur < time.Second:
			return bad("@every %v: the interval must be at least 1s", dur)
		case dur%time.Second != 0:
			return bad("@every %v: the interval must be a whole number of seconds", dur)
		}
		return cronSchedule{s: everySchedule{dur}}, "", nil
	}
	if strings.HasPrefix(rest, "TZ=") || strings.HasPrefix(rest, "CRON_TZ=") {
		return bad("more than one time zone prefix")
	}
	s, err := parseRobfig(rest)
	if err != nil {
		return bad("%w", err)
	}
	return cronSchedule{s: s, loc: loc}, loc.String(), nil
}

// parseRobfig guards against panics in the parser on odd input.
func parseRobfig(spec string) (s cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("cannot parse: %v", r)
		}
	}()
	return cronParser.Parse(spec)
}

// cronEntryID digests what makes an entry: two processes that register the
// same entry get the same ID.
func cronEntryID(spec, locName string, t *Task, o *enqueueOptions) string {
	h := sha256.New()
	field := func(s string) {
		h.Write([]byte(strconv.Itoa(len(s))))
		h.Write([]byte{':'})
		h.Write([]byte(s))
	}
	field("tide-cron-v1")
	field(strings.TrimSpace(spec))
	field(locName)
	field(t.typ)
	field(string(t.payload))
	for _, k := range slices.Sorted(maps.Keys(t.headers)) {
		field(k)
		field(t.headers[k])
	}
	field("|")
	field(o.queue)
	field(strconv.Itoa(o.maxRetry))
	field(o.timeout.String())
	field(strconv.FormatInt(o.uniqueTTL.Milliseconds(), 10))
	field(strconv.FormatInt(o.retention.Milliseconds(), 10))
	if !o.deadline.IsZero() {
		field(strconv.FormatInt(o.deadline.UnixMilli(), 10))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// validateEntryID checks a CronEntry.ID.
func validateEntryID(id string) error {
	if id == "" || len(id) > maxEntryIDLength {
		return fmt.Errorf("%w: cron entry ID %q must be 1 to %d bytes", ErrInvalidTask, id, maxEntryIDLength)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':' {
			continue
		}
		return fmt.Errorf("%w: cron entry ID %q has invalid character %q at byte %d (allowed: letters, digits, . _ - :)", ErrInvalidTask, id, c, i)
	}
	return nil
}
