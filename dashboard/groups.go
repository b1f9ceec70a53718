package dashboard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tidequeue/tide"
)

// groupsShown is how many groups the queue page and GET /api/live?q=
// list: those with the largest backlogs.
const groupsShown = 20

// flowData is a queue's limits and its groups with the largest backlogs,
// for the queue page's "Groups" panel.
type flowData struct {
	Limits    tide.QueueLimits
	HasLimits bool
	Groups    []groupRow
	// More is set when there may be more groups than the panel lists.
	More bool
}

// groupRow is a group in the panel; Name is the group key with the
// characters that could disguise it (bidirectional controls, zero-width
// characters...) shown as \u escapes.
type groupRow struct {
	tide.GroupInfo
	Name string
}

// groupJSON is a group in the JSON API. ThrottledUntil is null when the
// group is not held back.
type groupJSON struct {
	Group          string     `json:"group"`
	Waiting        int        `json:"waiting"`
	Running        int        `json:"running"`
	ThrottledUntil *time.Time `json:"throttled_until"`
}

func toGroupsJSON(gs []groupRow, now time.Time) []groupJSON {
	out := make([]groupJSON, len(gs))
	for i, g := range gs {
		out[i] = groupJSON{Group: g.Group, Waiting: g.Waiting, Running: g.Running}
		if g.ThrottledUntil.After(now) {
			u := g.ThrottledUntil.UTC().Truncate(time.Millisecond)
			out[i].ThrottledUntil = &u
		}
	}
	return out
}

// flow reads queue's limits and top groups. It returns nil, and no error,
// when the broker keeps neither (tide.ErrNotSupported).
func (h *handler) flow(ctx context.Context, queue string) (*flowData, error) {
	l, err := h.in.QueueLimits(ctx, queue)
	if errors.Is(err, tide.ErrNotSupported) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	gs, err := h.in.Groups(ctx, queue, groupsShown)
	if err != nil && !errors.Is(err, tide.ErrNotSupported) {
		return nil, err
	}
	f := &flowData{Limits: l, HasLimits: l != (tide.QueueLimits{}), More: len(gs) == groupsShown}
	for _, g := range gs {
		f.Groups = append(f.Groups, groupRow{GroupInfo: g, Name: shown(g.Group)})
	}
	return f, nil
}

// Show reports whether the panel is shown: when the queue has limits or
// groups.
func (f *flowData) Show() bool { return f != nil && (f.HasLimits || len(f.Groups) > 0) }

// shown escapes the unprintable characters of a name read from the broker
// (a group key, a task ID, which carries its group): format and control
// characters (bidirectional overrides, zero-width characters...) become
// \uHHHH and invalid UTF-8 \xHH, as in previews, so that they cannot
// disguise the name. html/template escapes the markup.
func shown(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r) || r == '\u200d' || r == '\ufe0f':
			b.WriteRune(r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += size
	}
	return b.String()
}

// limitText shows a concurrency limit, "none" for no limit.
func limitText(n int) string {
	if n == 0 {
		return "none"
	}
	return number(n)
}

// rateText shows a rate as "100 per 1s", "none" for no limit.
func rateText(r tide.Rate) string {
	if r.Limit == 0 {
		return "none"
	}
	per := r.Per.String()
	if strings.HasSuffix(per, "m0s") {
		per = strings.TrimSuffix(per, "0s")
	}
	if strings.HasSuffix(per, "h0m") {
		per = strings.TrimSuffix(per, "0m")
	}
	return number(r.Limit) + " per " + per
}
