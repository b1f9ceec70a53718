package redisbroker

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/tidetype"
)

// SetProgress implements broker.ProgressReporter: one script in the task's
// partition that checks the lease and writes the progress hash.
func (b *Broker) SetProgress(ctx context.Context, lease broker.LeaseRef, p tidetype.Progress) error {
	if p.Percent < 0 || p.Percent > 100 || len(p.Note) > tidetype.MaxProgressNote {
		return fmt.Errorf("%w: progress %d%% with a %d-byte note (0 to 100%%, at most %d bytes)", broker.ErrInvalidTask, p.Percent, len(p.Note), tidetype.MaxProgressNote)
	}
	return b.writeLeased(ctx, "set progress", b.s.progress, "pg", lease, encodeProgress(p))
}

// encodeProgress is the progress hash's value: "<percent>:<ms>:<note>".
func encodeProgress(p tidetype.Progress) string {
	return strconv.Itoa(p.Percent) + ":" + strconv.FormatInt(p.At.UnixMilli(), 10) + ":" + p.Note
}

// decodeProgress reads encodeProgress's value; ok is false for anything
// else (bytes that are not ours are not shown as progress).
func decodeProgress(s string) (tidetype.Progress, bool) {
	pc, rest, ok1 := strings.Cut(s, ":")
	ms, note, ok2 := strings.Cut(rest, ":")
	percent, err1 := strconv.Atoi(pc)
	at, err2 := strconv.ParseInt(ms, 10, 64)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || percent < 0 || percent > 100 || len(note) > tidetype.MaxProgressNote {
		return tidetype.Progress{}, false
	}
	return tidetype.Progress{Percent: percent, Note: note, At: time.UnixMilli(at)}, true
}
