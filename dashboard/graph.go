package dashboard

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/tidequeue/tide"
)

// maxGraphSteps caps the steps a workflow's graph draws: the steps nearest
// the start (by depth, then in the order they were added). The step table
// lists them all.
const maxGraphSteps = 300

// Graph geometry, in SVG user units. The SVG is drawn at its natural size
// in a box that scrolls, so that names stay readable however large the
// graph is.
const (
	nodeW, nodeH   = 176.0, 46.0
	colGap, rowGap = 48.0, 14.0
	graphPad       = 12.0
	// labelRunes is how much of a step name fits in a box.
	labelRunes = 22
)

// graph is a workflow drawn as inline SVG by the workflow template (no
// script, no library): steps as boxes in columns by depth (the longest path
// from a step without dependencies), an edge from each dependency to each
// step that depends on it.
type graph struct {
	W, H         float64
	NodeW, NodeH float64 // a box's size
	Nodes        []graphNode
	Edges        []graphEdge
	// Shown is the number of steps drawn, Total the workflow's; Columns
	// the number of depths drawn.
	Shown, Total, Columns int
}

// Capped reports whether some steps are not drawn.
func (g *graph) Capped() bool { return g.Shown < g.Total }

// graphNode is one step's box.
type graphNode struct {
	X, Y         float64
	NameX, NameY float64 // the name's baseline
	StY          float64 // the state's baseline
	Name         string
	Label        string // Name cut to fit the box
	Look         string // CSS class suffix: waiting, pending, active, retry, succeeded...
	State        string // the state as shown: "waiting", "enqueued · active"...
	URL          string // the task page, "" when the step has no task to show
	Title        string // tooltip
}

// graphEdge is a dependency: From must succeed (or end) before To runs.
type graphEdge struct {
	From, To string
	D        string // SVG path
}

// stepLook returns the CSS class suffix of a step and its state as shown:
// for an enqueued step, the state of its task when known.
func stepLook(s *tide.StepInfo) (look, label string) {
	switch s.State {
	case tide.StepWaiting:
		return "waiting", "waiting"
	case tide.StepEnqueued:
		if !s.TaskState.Valid() {
			return "enqueued", "enqueued"
		}
		ts := s.TaskState.String()
		return ts, "enqueued · " + ts
	case tide.StepSucceeded:
		return "succeeded", "succeeded"
	case tide.StepFailed:
		return "failed", "failed"
	case tide.StepCanceled:
		return "cancelled", "cancelled"
	}
	return "unknown", "unknown"
}

// stepTaskURL returns the task page of a step whose task has been stored
// (enqueued or finished), "" for a step that never had a task (waiting, or
// cancelled before it ran).
func stepTaskURL(s *tide.StepInfo) string {
	if s.TaskID == "" || s.Queue == "" {
		return ""
	}
	switch s.State {
	case tide.StepEnqueued, tide.StepSucceeded, tide.StepFailed:
		return taskLink(s.Queue, s.TaskID)
	}
	return ""
}

// stepDepths returns each step's depth: 0 for a step without
// dependencies, otherwise one more than its deepest dependency. Unknown
// dependencies are ignored; steps on a cycle (which EnqueueWorkflow
// refuses, so only damaged data has one) go one column past the rest.
func stepDepths(steps []tide.StepInfo) []int {
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		index[s.Name] = i
	}
	left := make([]int, len(steps))
	dependents := make([][]int, len(steps))
	for j, s := range steps {
		for _, a := range s.After {
			if i, ok := index[a]; ok && i != j {
				left[j]++
				dependents[i] = append(dependents[i], j)
			}
		}
	}
	depth := make([]int, len(steps))
	ready := make([]int, 0, len(steps))
	for i := range steps {
		if left[i] == 0 {
			ready = append(ready, i)
		}
	}
	done, deepest := 0, 0
	for len(ready) > 0 {
		i := ready[0]
		ready = ready[1:]
		done++
		deepest = max(deepest, depth[i])
		for _, j := range dependents[i] {
			depth[j] = max(depth[j], depth[i]+1)
			if left[j]--; left[j] == 0 {
				ready = append(ready, j)
			}
		}
	}
	if done < len(steps) {
		for i := range steps {
			if left[i] > 0 {
				depth[i] = deepest + 1
			}
		}
	}
	return depth
}

// maxDummies caps the waypoints of edges that skip columns (see
// layoutGraph); edges past the cap are drawn straight.
const maxDummies = 4 * maxGraphSteps

// slot is a place in a column: a step's box, or a waypoint of an edge that
// skips the column, which keeps the space it passes through free of boxes.
type slot struct {
	step  int   // the step's index; -1 for a waypoint
	preds []int // the slots in the previous column it comes from
	seq   int   // tie-breaker: the order slots were made
	row   float64
	y, h  float64 // top and height
}

// layoutGraph lays out the workflow's steps: columns by depth, each column
// ordered by where its steps' dependencies are (the mean of their rows,
// which keeps edges short and mostly uncrossed) and centred vertically. An
// edge that skips columns gets a waypoint in each column it crosses, so
// that it runs between boxes rather than behind one (Sugiyama's dummy
// nodes). At most maxGraphSteps steps are drawn.
func layoutGraph(steps []tide.StepInfo) *graph {
	g := &graph{Total: len(steps), NodeW: nodeW, NodeH: nodeH}
	if len(steps) == 0 {
		return g
	}
	depth := stepDepths(steps)
	order := make([]int, len(steps))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(depth[a], depth[b]) })
	order = order[:min(len(order), maxGraphSteps)]
	g.Shown = len(order)

	index := make(map[string]int, len(steps))
	for i, s := range steps {
		index[s.Name] = i
	}
	// Columns of drawn steps; col maps a drawn step to its column (empty
	// depths, which only a damaged workflow's cycle leaves, are skipped).
	var byDepth [][]int
	for _, i := range order {
		for len(byDepth) <= depth[i] {
			byDepth = append(byDepth, nil)
		}
		byDepth[depth[i]] = append(byDepth[depth[i]], i)
	}
	byDepth = slices.DeleteFunc(byDepth, func(c []int) bool { return len(c) == 0 })
	g.Columns = len(byDepth)
	var slots []*slot
	columns := make([][]int, len(byDepth)) // slot indexes
	col := make(map[int]int, len(order))
	home := make(map[int]int, len(order)) // step → its slot
	for c, steps := range byDepth {
		for _, i := range steps {
			col[i] = c
			home[i] = len(slots)
			columns[c] = append(columns[c], len(slots))
			slots = append(slots, &slot{step: i, seq: len(slots), h: nodeH})
		}
	}
	// Edges, each a chain of slots from its dependency to its dependent.
	type edge struct {
		from, to int   // steps
		via      []int // waypoint slots
	}
	var edges []edge
	dummies := 0
	for _, colSteps := range byDepth {
		for _, j := range colSteps {
			for _, a := range steps[j].After {
				i, ok := index[a]
				if _, drawn := col[i]; !ok || !drawn || i == j {
					continue
				}
				e := edge{from: i, to: j}
				prev := home[i]
				if col[j]-col[i] > 1 && dummies+col[j]-col[i]-1 <= maxDummies {
					for c := col[i] + 1; c < col[j]; c++ {
						s := &slot{step: -1, preds: []int{prev}, seq: len(slots), h: rowGap}
						prev = len(slots)
						e.via = append(e.via, prev)
						columns[c] = append(columns[c], prev)
						slots = append(slots, s)
						dummies++
					}
				}
				if col[j] > col[i] {
					slots[home[j]].preds = append(slots[home[j]].preds, prev)
				}
				edges = append(edges, e)
			}
		}
	}
	// Order each column by the mean row of what it comes from.
	for c, column := range columns {
		if c > 0 {
			key := make(map[int]float64, len(column))
			for _, k := range column {
				sum, n := 0.0, 0
				for _, p := range slots[k].preds {
					sum += slots[p].row
					n++
				}
				if n > 0 {
					key[k] = sum / float64(n)
				}
			}
			slices.SortStableFunc(column, func(a, b int) int {
				if c := cmp.Compare(key[a], key[b]); c != 0 {
					return c
				}
				return cmp.Compare(slots[a].seq, slots[b].seq)
			})
		}
		for r, k := range column {
			slots[k].row = float64(r)
		}
	}
	// Heights: boxes and waypoints stacked with rowGap between them, each
	// column centred on the tallest.
	colH := make([]float64, len(columns))
	tallest := 0.0
	for c, column := range columns {
		for r, k := range column {
			if r > 0 {
				colH[c] += rowGap
			}
			colH[c] += slots[k].h
		}
		tallest = max(tallest, colH[c])
	}
	g.W = 2*graphPad + float64(len(columns))*nodeW + float64(len(columns)-1)*colGap
	g.H = 2*graphPad + tallest
	colX := func(c int) float64 { return graphPad + float64(c)*(nodeW+colGap) }
	for c, column := range columns {
		y := graphPad + (tallest-colH[c])/2
		for _, k := range column {
			slots[k].y = y
			y += slots[k].h + rowGap
		}
	}
	for c, column := range columns {
		for _, k := range column {
			i := slots[k].step
			if i < 0 {
				continue
			}
			s := &steps[i]
			look, label := stepLook(s)
			n := graphNode{
				X: colX(c), Y: slots[k].y,
				Name: s.Name, Label: cut(s.Name, labelRunes), Look: look, State: label,
				URL: stepTaskURL(s), Title: stepTitle(s, label),
			}
			n.NameX, n.NameY, n.StY = n.X+10, n.Y+19, n.Y+36
			g.Nodes = append(g.Nodes, n)
		}
	}
	// Edge paths: a curve from the right side of the dependency to the
	// left side of the dependent, through each waypoint (a straight run
	// across the column it skips).
	curve := func(b *strings.Builder, x1, y1, x2, y2 float64) {
		dx := max((x2-x1)/2, 16)
		fmt.Fprintf(b, " C%g %g %g %g %g %g", x1+dx, y1, x2-dx, y2, x2, y2)
	}
	for _, e := range edges {
		var b strings.Builder
		from, to := slots[home[e.from]], slots[home[e.to]]
		x, y := colX(col[e.from])+nodeW, from.y+nodeH/2
		fmt.Fprintf(&b, "M%g %g", x, y)
		for n, k := range e.via {
			c := col[e.from] + 1 + n
			wy := slots[k].y + slots[k].h/2
			curve(&b, x, y, colX(c), wy)
			x, y = colX(c)+nodeW, wy
			fmt.Fprintf(&b, " L%g %g", x, y)
		}
		curve(&b, x, y, colX(col[e.to]), to.y+nodeH/2)
		g.Edges = append(g.Edges, graphEdge{From: steps[e.from].Name, To: steps[e.to].Name, D: b.String()})
	}
	return g
}

// stepTitle is a box's tooltip: the step's name, state, dependencies and
// error.
func stepTitle(s *tide.StepInfo, state string) string {
	var b strings.Builder
	b.WriteString(s.Name + ": " + state)
	if len(s.After) > 0 {
		b.WriteString("\nafter " + strings.Join(s.After, ", "))
	}
	if s.RunOnFailure {
		b.WriteString("\nruns even when a dependency fails")
	}
	if s.Err != "" {
		b.WriteString("\n" + oneText(cut(s.Err, 300)))
	}
	return b.String()
}

// cut returns s cut to n runes, with "…" when cut.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
