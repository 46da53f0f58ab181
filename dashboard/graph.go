package dashboard

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/display"
)

// The machine graph is drawn as an inline SVG computed here, no JavaScript.
// Steps go in layers by their distance from the start step along the
// declared and taken transitions (a step no edge reaches gets a layer of its
// own after them, in declaration order), the terminal "done" and "failed"
// nodes in the last layer. Layers are laid left to right and wrap into
// bands, top to bottom, so that the drawing is never wider than
// maxGraphWidth: the page's content width at a 1400 px window. Edges
// within a band go from a box's right side to the next's left side; edges
// to a later band from a box's bottom to the target's top; edges back (to
// the same or an earlier layer) dip under their band.

const (
	// maxGraphWidth is the widest the drawing gets: the inside of the
	// graph card at a 1400 px window (main is at most 1280 px wide with 24
	// px padding; the card has 18 px padding and a border).
	maxGraphWidth = 1190
	boxW          = 170
	colGap        = 60
	rowGap        = 22
	bandGap       = 44
	margin        = 16
	headH         = 30
	lineH         = 17
	boxPadB       = 10
	loopLineH     = 17
	backStep      = 16 // depth between back edges under a band
)

// graphCols is how many layers fit side by side in maxGraphWidth.
const graphCols = (maxGraphWidth - 2*margin + colGap) / (boxW + colGap)

// svgGraph is the drawing the template renders.
type svgGraph struct {
	Width, Height int
	Nodes         []*svgNode
	Edges         []svgEdge
	Bands         int
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
	layer    int
	band     int
	col      int
}

type svgLine struct {
	Text   string
	Status gendurable.Status
	Link   string
	Parked bool // a breakdown of the line above: waiting instances
	Y      int
}

type svgEdge struct {
	Path     string
	Label    string
	LX, LY   int
	Back     bool
	Declared bool // declared in the machine's Flow
	Taken    bool // taken at least once
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
		n := &svgNode{Name: name, Label: name, Terminal: terminal, layer: -1}
		nodes[k] = n
		order = append(order, n)
		return n
	}
	if g.Start != "" {
		add("", g.Start)
	}
	for _, s := range g.Steps {
		add("", s)
	}
	done, failed := add("done", "done"), add("failed", "failed")
	done.Label, failed.Label = "✓ done", "✗ failed"

	// Edges: declared ones, then taken ones (merged into the declared edge
	// they follow); replays are a note in their box.
	type edge struct {
		from, to *svgNode
		declared bool
		taken    map[string]int64 // outcome → count
	}
	var edges []*edge
	byPair := map[[2]*svgNode]*edge{}
	edgeOf := func(from, to *svgNode) *edge {
		k := [2]*svgNode{from, to}
		if e := byPair[k]; e != nil {
			return e
		}
		e := &edge{from: from, to: to, taken: map[string]int64{}}
		byPair[k] = e
		edges = append(edges, e)
		return e
	}
	for _, t := range g.Declared {
		to := done
		if t.To != "done" || !slices.Equal(t.Kinds, []string{"done"}) {
			to = add("", t.To)
		}
		edgeOf(add("", t.From), to).declared = true
	}
	loops := map[*svgNode]int64{}
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
		edgeOf(from, to).taken[t.Outcome] += t.Count
	}
	succ := map[*svgNode][]*svgNode{}
	for _, e := range edges {
		if e.to.Terminal == "" {
			succ[e.from] = append(succ[e.from], e.to)
		}
	}

	// Layers: BFS from the start step; then each step not reached, in
	// declaration order, a layer after the last, and BFS on from it.
	maxLayer := -1
	bfs := func(root *svgNode, layer int) {
		root.layer = layer
		maxLayer = max(maxLayer, layer)
		queue := []*svgNode{root}
		for len(queue) > 0 {
			n := queue[0]
			queue = queue[1:]
			for _, m := range succ[n] {
				if m.layer < 0 {
					m.layer = n.layer + 1
					maxLayer = max(maxLayer, m.layer)
					queue = append(queue, m)
				}
			}
		}
	}
	if s := nodes[nodeKey("", g.Start)]; s != nil && g.Start != "" {
		s.Start = true
		bfs(s, 0)
	}
	for _, n := range order {
		if n.Terminal == "" && n.layer < 0 {
			bfs(n, maxLayer+1)
		}
	}
	done.layer, failed.layer = maxLayer+1, maxLayer+1
	layers := maxLayer + 2
	for _, n := range order {
		n.band, n.col = n.layer/graphCols, n.layer%graphCols
	}
	bands := (layers + graphCols - 1) / graphCols

	// Box contents.
	var doneTotal, failedTotal int64
	for _, n := range order {
		if n.Terminal != "" {
			continue
		}
		parked := g.Parked[n.Name]
		for _, st := range allStatuses {
			c := g.Counts[n.Name][st]
			switch st {
			case gendurable.StatusDone:
				doneTotal += c
			case gendurable.StatusFailed:
				failedTotal += c
			}
			if c == 0 {
				continue
			}
			n.Lines = append(n.Lines, svgLine{Text: fmt.Sprintf("%s %d", st, c), Status: st,
				Link: d.listURL("machine", g.Machine, "step", n.Name, "status", string(st))})
			if st == gendurable.StatusRunnable {
				if parked.BackingOff > 0 {
					n.Lines = append(n.Lines, svgLine{Text: fmt.Sprintf("↳ backing off %d", parked.BackingOff), Parked: true})
				}
				if parked.Delayed > 0 {
					n.Lines = append(n.Lines, svgLine{Text: fmt.Sprintf("↳ delayed %d", parked.Delayed), Parked: true})
				}
			}
		}
		if len(n.Lines) == 0 {
			n.Lines = []svgLine{{Text: "no instances"}}
		}
		if c := loops[n]; c > 0 {
			n.Loop = fmt.Sprintf("↻ replayed %d", c)
		}
	}
	done.Lines = []svgLine{{Text: display.Count(doneTotal, "instance"), Status: gendurable.StatusDone,
		Link: d.listURL("machine", g.Machine, "status", "done")}}
	failed.Lines = []svgLine{{Text: display.Count(failedTotal, "instance"), Status: gendurable.StatusFailed,
		Link: d.listURL("machine", g.Machine, "status", "failed")}}

	// Edges back (to the same or an earlier layer) dip under their source's
	// band, each a step deeper.
	isBack := func(e *edge) bool { return e.to.layer <= e.from.layer }
	backs := make([]int, bands)
	for _, e := range edges {
		if isBack(e) {
			backs[e.from.band]++
		}
	}

	// Positions: stack each layer's boxes; bands one under the other.
	stackH := map[int]int{} // layer → height used
	for _, n := range order {
		n.W = boxW
		n.H = headH + lineH*len(n.Lines) + boxPadB
		if n.Loop != "" {
			n.H += loopLineH
		}
		stackH[n.layer] += n.H + rowGap
	}
	bandTop := make([]int, bands+1)
	bandTop[0] = margin
	for b := range bands {
		h := 0
		for l := b * graphCols; l < min(layers, (b+1)*graphCols); l++ {
			h = max(h, stackH[l]-rowGap)
		}
		bandTop[b+1] = bandTop[b] + h + bandGap + backStep*backs[b]
	}
	y := map[int]int{}
	for _, n := range order {
		n.X = margin + n.col*(boxW+colGap)
		n.Y = bandTop[n.band] + y[n.layer]
		y[n.layer] += n.H + rowGap
		for i := range n.Lines {
			n.Lines[i].Y = n.Y + headH + lineH*i + 12
		}
		n.LoopY = n.Y + headH + lineH*len(n.Lines) + 12
	}
	cols := min(layers, graphCols)
	out := &svgGraph{Width: 2*margin + cols*boxW + (cols-1)*colGap, Nodes: order, Bands: bands}
	out.Height = bandTop[bands] - bandGap + margin

	depth := make([]int, bands)
	for _, e := range edges {
		se := svgEdge{Label: edgeLabel(e.taken), Declared: e.declared, Taken: len(e.taken) > 0}
		f, t := e.from, e.to
		switch {
		case isBack(e):
			depth[f.band]++
			x1, y1 := f.X+f.W/2+10, f.Y+f.H
			x2, y2 := t.X+t.W/2-10, t.Y+t.H
			low := bandTop[f.band+1] - bandGap - backStep*backs[f.band] + backStep*depth[f.band] + 6
			if t.band < f.band {
				// Up to an earlier band: leave from the top.
				y1 = f.Y
				low = y1 - bandGap/2
			}
			se.Path = fmt.Sprintf("M%d,%d C%d,%d %d,%d %d,%d", x1, y1, x1, low, x2, max(low, y2+bandGap/2), x2, y2+4)
			se.LX, se.LY = (x1+x2)/2, (y1+y2+6*low)/8-4
			se.Back = true
		case t.band == f.band:
			x1, y1 := f.X+f.W, f.Y+f.H/2
			x2, y2 := t.X, t.Y+t.H/2
			dx := (x2 - x1) / 2
			se.Path = fmt.Sprintf("M%d,%d C%d,%d %d,%d %d,%d", x1, y1, x1+dx, y1, x2-dx, y2, x2-4, y2)
			se.LX, se.LY = (x1+x2)/2, (y1+y2)/2-5
		default: // on to a later band: bottom to top
			x1, y1 := f.X+f.W/2, f.Y+f.H
			x2, y2 := t.X+t.W/2, t.Y
			dy := max((y2-y1)/2, bandGap)
			se.Path = fmt.Sprintf("M%d,%d C%d,%d %d,%d %d,%d", x1, y1, x1, y1+dy, x2, y2-dy, x2, y2-4)
			se.LX, se.LY = (x1+x2)/2, (y1+y2)/2
		}
		out.Edges = append(out.Edges, se)
	}
	return out
}

// edgeLabel counts an edge's transitions: Next, Done and Stop as a plain
// number, Await and ScheduleChildren named ("2 · await 1").
func edgeLabel(taken map[string]int64) string {
	var parts []string
	if n := taken["next"] + taken["done"] + taken["stop"]; n > 0 {
		parts = append(parts, fmt.Sprint(n))
	}
	for _, o := range []string{"await", "children"} {
		if taken[o] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", o, taken[o]))
		}
	}
	return strings.Join(parts, " · ")
}

// stepOrder is the machine's steps in the drawing's order: the declared
// order (the start step first), then any step only an edge names.
func (g *svgGraph) stepOrder() []string {
	var out []string
	for _, n := range g.Nodes {
		if n.Terminal == "" {
			out = append(out, n.Name)
		}
	}
	return out
}
