package dashboard

import (
	"fmt"
	"math"
	"time"
)

// chart is a bar chart of processed and failed tasks per day, drawn as
// inline SVG by the templates (no script, no library). Coordinates are in
// the SVG's viewBox units.
type chart struct {
	W, H                   int
	Left, Right, Top, Base float64 // plot area
	PlotH, TickX, LabelY   float64
	MidX, MidY             float64
	Days                   int
	Processed, Failed      int // totals over the days
	Empty                  bool
	Bars                   []chartBar
	Ticks                  []chartTick
	Labels                 []chartLabel
}

type chartBar struct {
	X, W         float64
	OkY, OkH     float64 // succeeded part, from the baseline up
	FailY, FailH float64 // failed part, stacked on top
	Title        string
}

type chartTick struct {
	Y     float64
	Label string
}

type chartLabel struct {
	X     float64
	Label string
}

// day is one day's counters.
type day struct {
	Date              time.Time
	Processed, Failed int
}

// newChart lays out days (oldest first).
func newChart(days []day) *chart {
	c := &chart{W: 760, H: 220, Left: 52, Right: 748, Top: 12, Base: 190, Days: len(days)}
	c.PlotH, c.TickX, c.LabelY = c.Base-c.Top, c.Left-8, c.Base+20
	c.MidX, c.MidY = (c.Left+c.Right)/2, (c.Top+c.Base)/2
	most := 0
	for _, d := range days {
		c.Processed += d.Processed
		c.Failed += d.Failed
		most = max(most, d.Processed, d.Failed)
	}
	c.Empty = c.Processed == 0 && c.Failed == 0
	step := niceStep(float64(most) / 4)
	top := step * math.Max(1, math.Ceil(float64(most)/step))
	plotH := c.Base - c.Top
	y := func(v int) float64 { return round1(c.Base - float64(v)/top*plotH) }
	for v := 0.0; v <= top+step/2; v += step {
		c.Ticks = append(c.Ticks, chartTick{Y: y(int(v)), Label: number(int(v))})
	}
	if len(days) == 0 {
		return c
	}
	slot := (c.Right - c.Left) / float64(len(days))
	every := 1
	if len(days) > 10 {
		every = 5
	}
	for i, d := range days {
		ok := max(d.Processed-d.Failed, 0)
		b := chartBar{X: round1(c.Left + float64(i)*slot + slot*0.15), W: round1(slot * 0.7)}
		b.OkY = y(ok)
		b.OkH = round1(c.Base - b.OkY)
		b.FailY = y(ok + d.Failed)
		b.FailH = round1(b.OkY - b.FailY)
		b.Title = fmt.Sprintf("%s: %s processed, %s failed", d.Date.UTC().Format("Mon Jan 2"), number(d.Processed), number(d.Failed))
		c.Bars = append(c.Bars, b)
		if (len(days)-1-i)%every == 0 {
			c.Labels = append(c.Labels, chartLabel{X: round1(c.Left + (float64(i)+0.5)*slot), Label: d.Date.UTC().Format("Jan 2")})
		}
	}
	return c
}

// niceStep returns the smallest 1, 2 or 5 times a power of ten that is at
// least x, and at least 1.
func niceStep(x float64) float64 {
	if x <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

// mergeHistory sums per-queue histories (each newest first, as
// Inspector.History returns them) by date and returns the days oldest first.
// Days missing from every history (a broker that returns fewer) are filled
// with zeros so the chart always spans n days ending today (UTC).
func mergeHistory(hs [][]day, n int, now time.Time) []day {
	today := now.UTC().Truncate(24 * time.Hour)
	out := make([]day, n)
	for i := range out {
		out[i].Date = today.AddDate(0, 0, i-n+1)
	}
	for _, h := range hs {
		for _, d := range h {
			i := n - 1 - int(today.Sub(d.Date.UTC().Truncate(24*time.Hour))/(24*time.Hour))
			if i >= 0 && i < n {
				out[i].Processed += d.Processed
				out[i].Failed += d.Failed
			}
		}
	}
	return out
}
