package dashboard

import (
	"fmt"
	"sort"

	"github.com/gendurable/gendurable"
)

// The machine graph is drawn as an inline SVG computed here: steps in
// columns by their distance from the start step along observed
// transitions, the terminal "done" and "failed" nodes in the last column,
// forward edges as curves from right to left side, backward edges as curves
// under the boxes. No JavaScript.

const (
	boxW      = 190
	colGap    = 90
	rowGap    = 26
	margin    = 24
	headH     = 30
	lineH     = 17
	boxPadB   = 10
	loopLineH = 17
)

// svgGraph is the drawing the template renders.
type svgGraph struct {
	Width, Height int
	Nodes         []*svgNode
	Edges         []svgEdge
}

type svgNode struct {
	Name     string // step name, or "done" / "failed" for terminals
	Label    string
	Terminal string // "", "done" or "failed"
	Start    bool
	X, Y     int
	W, H     int
	Lines    []svgLine
	Loop     string // replay self-loop summary
	LoopY    int
	col      int
}

type svgLine struct {
	Text   string
	Status gendurable.Status
	Link   string
	Y      int
}

type svgEdge struct {
	Path   string
	Label  string
	LX, LY int
	Back   bool
}

// nodeKey keys terminal nodes apart from steps of the same name.
func nodeKey(terminal, name string) string { return terminal + "\x00" + name }

func (d *dashboard) layoutGraph(g *gendurable.MachineGraph) *svgGraph {
	nodes := map[string]*svgNode{}
	var order []*svgNode
	add := func(terminal, name string) *svgNode {
		k := nodeKey(terminal, name)
		if n := nodes[k]; n != nil {
			return n
		}
		n := &svgNode{Name: name, Label: name, Terminal: terminal, col: -1}
		nodes[k] = n
		order = append(order, n)
		return n
	}
	steps := append([]string(nil), g.Steps...)
	if g.Start != "" {
		// Start first, then the declared order (sorted by the engine).
		sort.SliceStable(steps, func(i, j int) bool { return steps[i] == g.Start && steps[j] != g.Start })
	}
	for _, s := range steps {
		add("", s)
	}
	done, failed := add("done", "done"), add("failed", "failed")
	done.Label, failed.Label = "✓ done", "✗ failed"

	// Edges between nodes, and replay loops.
	type edge struct {
		from, to *svgNode
		label    string
	}
	var edges []edge
	loops := map[*svgNode]int64{}
	succ := map[*svgNode][]*svgNode{}
	for _, t := range g.Transitions {
		from := add("", t.From)
		var to *svgNode
		switch t.Outcome {
		case "done":
			to = done
		case "stop":
			to = failed
		default:
			to = add("", t.To)
		}
		if to == from {
			loops[from] += t.Count
			continue
		}
		label := fmt.Sprintf("%d", t.Count)
		if t.Outcome != "next" && t.Outcome != "done" && t.Outcome != "stop" {
			label = t.Outcome + " " + label
		}
		edges = append(edges, edge{from, to, label})
		if to.Terminal == "" {
			succ[from] = append(succ[from], to)
		}
	}

	// Columns: BFS from the start step over observed step edges.
	maxCol := 0
	if s := nodes[nodeKey("", g.Start)]; s != nil {
		s.col = 0
		s.Start = true
		queue := []*svgNode{s}
		for len(queue) > 0 {
			n := queue[0]
			queue = queue[1:]
			for _, m := range succ[n] {
				if m.col < 0 {
					m.col = n.col + 1
					maxCol = max(maxCol, m.col)
					queue = append(queue, m)
				}
			}
		}
	}
	// Steps never reached (no transitions observed yet): one column after.
	unreached := false
	for _, n := range order {
		if n.Terminal == "" && n.col < 0 {
			n.col = maxCol + 1
			unreached = true
		}
	}
	if unreached {
		maxCol++
	}
	done.col, failed.col = maxCol+1, maxCol+1

	// Box contents.
	var doneTotal, failedTotal int64
	for _, n := range order {
		if n.Terminal != "" {
			continue
		}
		for _, st := range allStatuses {
			c := g.Counts[n.Name][st]
			switch st {
			case gendurable.StatusDone:
				doneTotal += c
			case gendurable.StatusFailed:
				failedTotal += c
			}
			if c > 0 {
				n.Lines = append(n.Lines, svgLine{Text: fmt.Sprintf("%s %d", st, c), Status: st,
					Link: d.listURL("machine", g.Machine, "step", n.Name, "status", string(st))})
			}
		}
		if len(n.Lines) == 0 {
			n.Lines = []svgLine{{Text: "no instances"}}
		}
		if c := loops[n]; c > 0 {
			n.Loop = fmt.Sprintf("↻ replayed %d", c)
		}
	}
	done.Lines = []svgLine{{Text: plural(doneTotal, "instance"), Status: gendurable.StatusDone,
		Link: d.listURL("machine", g.Machine, "status", "done")}}
	failed.Lines = []svgLine{{Text: plural(failedTotal, "instance"), Status: gendurable.StatusFailed,
		Link: d.listURL("machine", g.Machine, "status", "failed")}}

	// Positions: stack each column's boxes.
	colY := map[int]int{}
	height := 0
	for _, n := range order {
		n.W = boxW
		n.H = headH + lineH*len(n.Lines) + boxPadB
		if n.Loop != "" {
			n.H += loopLineH
		}
		n.X = margin + n.col*(boxW+colGap)
		y, ok := colY[n.col]
		if !ok {
			y = margin
		}
		n.Y = y
		for i := range n.Lines {
			n.Lines[i].Y = n.Y + headH + lineH*i + 12
		}
		n.LoopY = n.Y + headH + lineH*len(n.Lines) + 12
		colY[n.col] = y + n.H + rowGap
		height = max(height, n.Y+n.H)
	}
	out := &svgGraph{Width: margin*2 + (maxCol+2)*boxW + (maxCol+1)*colGap, Nodes: order}

	// Edges. Backward and same-column ones dip under the drawing; give
	// each its own depth so they do not overlap.
	backDepth := 0
	var drawn []svgEdge
	for _, e := range edges {
		if e.to.col > e.from.col {
			x1, y1 := e.from.X+e.from.W, e.from.Y+e.from.H/2
			x2, y2 := e.to.X, e.to.Y+e.to.H/2
			dx := (x2 - x1) / 2
			drawn = append(drawn, svgEdge{
				Path:  fmt.Sprintf("M%d,%d C%d,%d %d,%d %d,%d", x1, y1, x1+dx, y1, x2-dx, y2, x2-4, y2),
				Label: e.label,
				LX:    (x1 + x2) / 2, LY: (y1+y2)/2 - 5,
			})
			continue
		}
		backDepth++
		x1, y1 := e.from.X+e.from.W/2+10, e.from.Y+e.from.H
		x2, y2 := e.to.X+e.to.W/2-10, e.to.Y+e.to.H
		low := height + 18*backDepth
		drawn = append(drawn, svgEdge{
			Path:  fmt.Sprintf("M%d,%d C%d,%d %d,%d %d,%d", x1, y1, x1, low, x2, low, x2, y2+4),
			Label: e.label,
			LX:    (x1 + x2) / 2, LY: (y1+y2+6*low)/8 - 4,
			Back: true,
		})
	}
	out.Edges = drawn
	out.Height = height + margin + 18*backDepth + 8
	return out
}

func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// stepOrder is the machine's steps in the drawing's order: by column, then
// top to bottom.
func (g *svgGraph) stepOrder() []string {
	nodes := make([]*svgNode, 0, len(g.Nodes))
	for _, n := range g.Nodes {
		if n.Terminal == "" {
			nodes = append(nodes, n)
		}
	}
	sort.SliceStable(nodes, func(i, j int) bool {
		if nodes[i].col != nodes[j].col {
			return nodes[i].col < nodes[j].col
		}
		return nodes[i].Y < nodes[j].Y
	})
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.Name
	}
	return out
}
