package redisbroker

import (
	"strings"
	"time"

	"github.com/tidequeue/tide/tidetype"
)

// ScriptFiles maps the SHA1 of each script, as Redis runs it (prelude and
// body), to its file name.
func ScriptFiles() map[string]string {
	out := map[string]string{}
	for name, s := range loadScripts().byFile {
		out[s.Hash()] = name
	}
	return out
}

// ScriptHeader returns the leading comment of a script file, without the
// comment marks.
func ScriptHeader(file string) string {
	var sb strings.Builder
	for _, line := range strings.Split(mustRead(file), "\n") {
		if !strings.HasPrefix(line, "--") {
			break
		}
		sb.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "--"), " "))
		sb.WriteByte('\n')
	}
	return sb.String()
}

// ScriptNames returns the file names of the scripts the broker runs.
func ScriptNames() []string {
	var out []string
	for name := range loadScripts().byFile {
		out = append(out, name)
	}
	return out
}

// SetAfterHold sets a function that Repartition runs after it held grouped
// tasks with free IDs back (see holdFreeIDs) and before it records the new
// layout; nil removes it. Tests that set it must not run in parallel with
// other repartitions.
func SetAfterHold(f func(queue string)) { afterHold = f }

// SetAfterClaim sets a function that an enqueue of a grouped task with a
// free ID on several partitions runs after its claim and before its store
// (an error ends the enqueue there, as if the client died); nil removes
// it. Tests that set it must not run in parallel with others that do.
func SetAfterClaim(f func(id string) error) {
	if f == nil {
		afterClaim.Store(nil)
		return
	}
	afterClaim.Store(&f)
}

// SetAfterLookup sets a function that Delete and Cancel run after their
// lookup by ID and before the removal; nil removes it. Tests that set it
// must not run in parallel with others that do.
func SetAfterLookup(f func(id string)) {
	if f == nil {
		afterLookup.Store(nil)
		return
	}
	afterLookup.Store(&f)
}

// SetClockSlack sets the clock difference between Redis nodes that the
// free-ID protocol allows for (a minute by default) and returns the old
// value.
func SetClockSlack(d time.Duration) time.Duration {
	return time.Duration(slackNs.Swap(int64(d)))
}

// PausePlain makes the broker serve the partition with key prefix base by
// the general lease and settle scripts alone for d (as after a plain
// script refused a call).
func PausePlain(b *Broker, base string, d time.Duration) {
	b.plainOff.Store(base, time.Now().Add(d).UnixNano())
}

// SetLimitsRecorded sets a function that SetQueueLimits runs after it
// recorded the limits and before it gives the partitions their settings;
// nil removes it.
func SetLimitsRecorded(f func(queue string)) {
	if f == nil {
		limitsRecorded.Store(nil)
		return
	}
	limitsRecorded.Store(&f)
}

// SetAfterMove sets a function that a Replace moving a grouped task with a
// free ID into a group of another partition runs after each of its steps
// ("claimed", "left", "stored"; an error ends the enqueue there, as if the
// client died); nil removes it. Tests that set it must not run in parallel
// with others that do.
func SetAfterMove(f func(id, step string) error) {
	if f == nil {
		afterMove.Store(nil)
		return
	}
	afterMove.Store(&f)
}

// SetHoldWait sets how long an enqueue refused by a repartition's hold of
// free grouped IDs waits for the new layout and returns the old value.
func SetHoldWait(d time.Duration) time.Duration {
	return time.Duration(holdWait.Swap(int64(d)))
}

// DecodeEvents reads one entry of a partition's events stream (its field
// "e"): when it was written and the events it holds.
func DecodeEvents(v string) (time.Time, []tidetype.TaskEvent, error) { return decodeEvents(v) }
