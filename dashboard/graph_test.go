package dashboard

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tidequeue/tide"
)

func step(name string, st tide.StepState, after ...string) tide.StepInfo {
	return tide.StepInfo{Name: name, Queue: "default", TaskID: "wf." + name, State: st, After: after}
}

func nodeByName(t *testing.T, g *graph, name string) graphNode {
	t.Helper()
	for _, n := range g.Nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %q", name)
	return graphNode{}
}

func edgeSet(g *graph) []string {
	var out []string
	for _, e := range g.Edges {
		out = append(out, e.From+">"+e.To)
	}
	slices.Sort(out)
	return out
}

// TestLayoutDiamond lays out a diamond with a shortcut (a→d): columns by
// longest path, the middle column centred, an edge per dependency.
func TestLayoutDiamond(t *testing.T) {
	t.Parallel()
	steps := []tide.StepInfo{
		step("d", tide.StepWaiting, "b", "c", "a"),
		step("a", tide.StepSucceeded),
		step("b", tide.StepEnqueued, "a"),
		step("c", tide.StepFailed, "a"),
	}
	steps[2].TaskState = tide.StateActive
	g := layoutGraph(steps)
	if g.Shown != 4 || g.Total != 4 || g.Capped() || g.Columns != 3 || len(g.Nodes) != 4 {
		t.Fatalf("graph: shown %d total %d columns %d nodes %d", g.Shown, g.Total, g.Columns, len(g.Nodes))
	}
	if got, want := edgeSet(g), []string{"a>b", "a>c", "a>d", "b>d", "c>d"}; !slices.Equal(got, want) {
		t.Errorf("edges %v, want %v", got, want)
	}
	a, b, c, d := nodeByName(t, g, "a"), nodeByName(t, g, "b"), nodeByName(t, g, "c"), nodeByName(t, g, "d")
	if !(a.X < b.X && b.X == c.X && c.X < d.X) {
		t.Errorf("columns: a %v b %v c %v d %v", a.X, b.X, c.X, d.X)
	}
	if b.Y+nodeH > c.Y || a.Y != d.Y {
		t.Errorf("rows: a %v b %v c %v d %v (b above c, a and d level)", a.Y, b.Y, c.Y, d.Y)
	}
	// The shortcut a→d runs through a waypoint in b and c's column, clear
	// of both boxes; the middle column holds two boxes and the waypoint.
	var short graphEdge
	for _, e := range g.Edges {
		if e.From == "a" && e.To == "d" {
			short = e
		}
	}
	var wx1, wy1, wx2, wy2 float64
	if l := strings.Index(short.D, " L"); l < 0 || strings.Count(short.D, " L") != 1 {
		t.Fatalf("a→d has no waypoint: %s", short.D)
	} else {
		fields := strings.Fields(short.D[:l])
		fmt.Sscanf(fields[len(fields)-2]+" "+fields[len(fields)-1], "%g %g", &wx1, &wy1)
		fmt.Sscanf(short.D[l+2:], "%g %g", &wx2, &wy2)
	}
	if wx1 != b.X || wx2 != b.X+nodeW || wy1 != wy2 {
		t.Errorf("a→d crosses the middle column from %v,%v to %v,%v; want a level run over x %v..%v", wx1, wy1, wx2, wy2, b.X, b.X+nodeW)
	}
	for _, n := range []graphNode{b, c} {
		if wy1 >= n.Y && wy1 <= n.Y+nodeH {
			t.Errorf("a→d runs through %s's box (y %v, box %v..%v)", n.Name, wy1, n.Y, n.Y+nodeH)
		}
	}
	if g.W != 2*graphPad+3*nodeW+2*colGap || g.H != 2*graphPad+2*nodeH+3*rowGap {
		t.Errorf("size %vx%v", g.W, g.H)
	}
	for _, n := range g.Nodes {
		if n.X < 0 || n.Y < 0 || n.X+nodeW > g.W || n.Y+nodeH > g.H {
			t.Errorf("node %s at %v,%v outside %vx%v", n.Name, n.X, n.Y, g.W, g.H)
		}
	}
	// Looks, labels and links.
	if b.Look != "active" || b.State != "enqueued · active" || b.URL != "/task?id=wf.b&q=default" {
		t.Errorf("b: %+v", b)
	}
	if d.Look != "waiting" || d.URL != "" {
		t.Errorf("a waiting step: %+v", d)
	}
	if a.Look != "succeeded" || c.Look != "failed" || c.URL == "" {
		t.Errorf("a %+v c %+v", a, c)
	}
	// An edge runs from the right side of its dependency to the left side
	// of its dependent.
	if g.NodeW != nodeW || g.NodeH != nodeH {
		t.Errorf("box size %vx%v", g.NodeW, g.NodeH)
	}
	for _, e := range g.Edges {
		from, to := nodeByName(t, g, e.From), nodeByName(t, g, e.To)
		if !strings.HasPrefix(e.D, fmt.Sprintf("M%g %g C", from.X+nodeW, from.Y+nodeH/2)) ||
			!strings.HasSuffix(e.D, fmt.Sprintf(" %g %g", to.X, to.Y+nodeH/2)) {
			t.Errorf("edge %s→%s: %s", e.From, e.To, e.D)
		}
	}
}

// TestLayoutOrdersByDependencies: a column is ordered by where its steps'
// dependencies are, so that two chains do not cross.
func TestLayoutOrdersByDependencies(t *testing.T) {
	t.Parallel()
	steps := []tide.StepInfo{
		step("x1", tide.StepSucceeded),
		step("y1", tide.StepSucceeded),
		step("y2", tide.StepWaiting, "y1"), // added before x2
		step("x2", tide.StepWaiting, "x1"),
	}
	g := layoutGraph(steps)
	x2, y2 := nodeByName(t, g, "x2"), nodeByName(t, g, "y2")
	if x2.Y >= y2.Y {
		t.Errorf("x2 at %v, y2 at %v: the chains cross", x2.Y, y2.Y)
	}
}

// TestLayoutCap draws at most maxGraphSteps steps, the ones nearest the
// start, and only the edges between drawn steps.
func TestLayoutCap(t *testing.T) {
	t.Parallel()
	var steps []tide.StepInfo
	for i := range maxGraphSteps + 10 {
		steps = append(steps, step(fmt.Sprint("s", i), tide.StepWaiting, "root"))
	}
	steps = append(steps, step("root", tide.StepEnqueued)) // added last, drawn first
	g := layoutGraph(steps)
	if !g.Capped() || g.Shown != maxGraphSteps || len(g.Nodes) != maxGraphSteps || g.Total != maxGraphSteps+11 {
		t.Fatalf("shown %d of %d, %d nodes", g.Shown, g.Total, len(g.Nodes))
	}
	if len(g.Edges) != maxGraphSteps-1 {
		t.Errorf("%d edges, want %d", len(g.Edges), maxGraphSteps-1)
	}
	nodeByName(t, g, "root")
	if g.Columns != 2 {
		t.Errorf("%d columns", g.Columns)
	}
	if empty := layoutGraph(nil); len(empty.Nodes) != 0 || empty.Capped() {
		t.Errorf("empty graph: %+v", empty)
	}
}

// TestLayoutWaypointCap: a long chain whose every step also depends on
// the root would need tens of thousands of waypoints; past maxDummies the
// edges are drawn straight, and every edge is still drawn once.
func TestLayoutWaypointCap(t *testing.T) {
	t.Parallel()
	steps := []tide.StepInfo{step("root", tide.StepSucceeded)}
	steps = append(steps, step("s0", tide.StepWaiting, "root"))
	for i := 1; i < maxGraphSteps-1; i++ {
		steps = append(steps, step(fmt.Sprint("s", i), tide.StepWaiting, fmt.Sprint("s", i-1), "root"))
	}
	g := layoutGraph(steps)
	if len(g.Nodes) != maxGraphSteps || g.Columns != maxGraphSteps {
		t.Fatalf("%d nodes in %d columns", len(g.Nodes), g.Columns)
	}
	if want := 1 + 2*(maxGraphSteps-2); len(g.Edges) != want {
		t.Errorf("%d edges, want %d", len(g.Edges), want)
	}
	waypoints := 0
	for _, e := range g.Edges {
		waypoints += strings.Count(e.D, " L")
	}
	if waypoints == 0 || waypoints > maxDummies {
		t.Errorf("%d waypoints, want 1 to %d", waypoints, maxDummies)
	}
}

// TestStepDepths: longest path from a root; a damaged workflow's cycle and
// unknown dependencies do not hang or crash the layout.
func TestStepDepths(t *testing.T) {
	t.Parallel()
	steps := []tide.StepInfo{
		step("a", 0), step("b", 0, "a"), step("c", 0, "b"), step("d", 0, "a", "c"),
		step("e", 0, "ghost"),
	}
	if got := stepDepths(steps); !slices.Equal(got, []int{0, 1, 2, 3, 0}) {
		t.Errorf("depths %v", got)
	}
	cyc := []tide.StepInfo{step("r", 0), step("p", 0, "q", "r"), step("q", 0, "p"), step("self", 0, "self")}
	if got := stepDepths(cyc); !slices.Equal(got, []int{0, 1, 1, 0}) {
		t.Errorf("depths with a cycle %v", got)
	}
	if g := layoutGraph(cyc); len(g.Nodes) != 4 {
		t.Errorf("a cyclic workflow draws %d nodes", len(g.Nodes))
	}
}

func TestStepLook(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		st          tide.StepState
		ts          tide.TaskState
		look, label string
		linked      bool
	}{
		{tide.StepWaiting, 0, "waiting", "waiting", false},
		{tide.StepEnqueued, 0, "enqueued", "enqueued", true},
		{tide.StepEnqueued, tide.StatePending, "pending", "enqueued · pending", true},
		{tide.StepEnqueued, tide.StateRetry, "retry", "enqueued · retry", true},
		{tide.StepSucceeded, 0, "succeeded", "succeeded", true},
		{tide.StepFailed, 0, "failed", "failed", true},
		{tide.StepCanceled, 0, "cancelled", "cancelled", false},
		{0, 0, "unknown", "unknown", false},
	} {
		s := step("x", c.st)
		s.TaskState = c.ts
		look, label := stepLook(&s)
		if look != c.look || label != c.label || (stepTaskURL(&s) != "") != c.linked {
			t.Errorf("%v/%v: %q %q linked %v", c.st, c.ts, look, label, stepTaskURL(&s) != "")
		}
	}
}

func TestProgressBar(t *testing.T) {
	t.Parallel()
	b := newProgressBar(10, 5, 2, 1)
	if len(b.Segs) != 3 || b.Segs[0] != (barSeg{"ok", 0, 500}) || b.Segs[1] != (barSeg{"failed", 500, 200}) || b.Segs[2] != (barSeg{"cancelled", 700, 100}) {
		t.Errorf("segments %+v", b.Segs)
	}
	if b.Label != "5 succeeded, 2 failed, 1 cancelled, 2 pending of 10" {
		t.Errorf("label %q", b.Label)
	}
	if b := newProgressBar(0, 0, 0, 0); len(b.Segs) != 0 {
		t.Errorf("empty bar %+v", b.Segs)
	}
	if b := newProgressBar(4, 0, 9, 0); len(b.Segs) != 1 || b.Segs[0].W != 1000 {
		t.Errorf("overfull bar %+v", b.Segs)
	}
}

func TestFailedRows(t *testing.T) {
	t.Parallel()
	steps := []tide.StepInfo{step("a", tide.StepFailed)}
	ids := []string{"wf.a", "elsewhere"}
	for i := range failedShown + 5 {
		ids = append(ids, fmt.Sprint("x", i))
	}
	rows, more := failedRows(ids, steps)
	if len(rows) != failedShown || more != 7 || rows[0] != (failedRow{"wf.a", "/task?id=wf.a&q=default"}) || rows[1] != (failedRow{"elsewhere", ""}) {
		t.Errorf("rows %v… more %d", rows[:2], more)
	}
	if rows, more := failedRows(nil, nil); rows != nil || more != 0 {
		t.Errorf("no failures: %v %d", rows, more)
	}
}

func TestNewPager(t *testing.T) {
	t.Parallel()
	p := newPager("/workflows", 2, 20, 45, 20)
	if p.From != 21 || p.To != 40 || p.Pages != 3 || p.PrevURL != "/workflows" || p.NextURL != "/workflows?page=3" {
		t.Errorf("%+v", p)
	}
	p = newPager("/batches", 1, 50, 10, 10)
	if p.PrevURL != "" || p.NextURL != "" || p.PageSizes[1].URL != "/batches?size=50" || !p.PageSizes[1].Current {
		t.Errorf("%+v", p)
	}
}
