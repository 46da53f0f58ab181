package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/display"
)

// machinesCmd lists every machine stored in the database (an engine stores
// those it registers when it starts), or, given a name, prints one
// machine's graph: its steps in declared order with counts, its declared
// transitions and the transitions taken (docs/design.md §9).
func machinesCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("machines")
	var c common
	c.register(fs)
	pos, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageError{msg: fmt.Sprintf("machines takes at most one machine NAME, got %d arguments", len(pos)), help: true}
	}
	if len(pos) == 1 {
		if err := nameArg("machine", pos[0]); err != nil {
			return err
		}
	}
	eng, done, err := c.engine(ctx, stderr)
	if err != nil {
		return err
	}
	defer done()
	if len(pos) == 1 {
		return machineGraph(ctx, eng, pos[0], c.json, stdout)
	}
	ms, err := eng.ListMachines(ctx)
	if err != nil {
		return err
	}
	if c.json {
		if ms == nil {
			ms = []gendurable.MachineInfo{}
		}
		return printJSON(stdout, ms)
	}
	if len(ms) == 0 {
		_, err := fmt.Fprintln(stdout, "no machine is stored yet: an engine stores the machines it registers when it starts")
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MACHINE\tVERSION\tSTART\tSTEPS\tTRANSITIONS\tLAST STARTED")
	for _, m := range ms {
		flow, seen := "taken only", "never (not stored)"
		if m.Flow {
			flow = "declared"
		}
		if m.SeenAt != nil {
			seen = m.SeenAt.Local().Format(localStamp)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", display.Terminal(m.Name), m.Version, display.Terminal(m.Start), len(m.Steps), flow, seen)
	}
	return tw.Flush()
}

func machineGraph(ctx context.Context, eng *gendurable.Engine, name string, asJSON bool, stdout io.Writer) error {
	g, err := eng.Graph(ctx, name)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, g)
	}
	p := display.Terminal
	versions := make([]string, len(g.Versions))
	for i, v := range g.Versions {
		versions[i] = fmt.Sprint(v)
	}
	if len(versions) == 0 {
		// Known from the instance table only (a newcomer read the empty
		// header as a fault).
		fmt.Fprintf(stdout, "machine %s  (no definition stored: no engine that registers it has started; steps from its instances)\n\n", p(g.Machine))
	} else {
		fmt.Fprintf(stdout, "machine %s  versions %s  start %s\n\n", p(g.Machine), strings.Join(versions, ", "), p(g.Start))
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\trunnable\t(backing off\tdelayed)\texecuting\tawaiting_signal\tawaiting_children\tdone\tfailed\t")
	for _, s := range g.Steps {
		c, pk := g.Counts[s], g.Parked[s]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", p(s), c[gendurable.StatusRunnable], pk.BackingOff, pk.Delayed,
			c[gendurable.StatusExecuting], c[gendurable.StatusAwaitingSignal], c[gendurable.StatusAwaitingChildren],
			c[gendurable.StatusDone], c[gendurable.StatusFailed])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(g.Declared) > 0 {
		fmt.Fprintln(stdout, "\ndeclared transitions:")
		for _, d := range g.Declared {
			fmt.Fprintf(stdout, "  %s → %s (%s)\n", p(d.From), p(d.To), strings.Join(d.Kinds, ", "))
		}
	} else {
		fmt.Fprintln(stdout, "\nno declared transitions (the machine has no Flow)")
	}
	if len(g.Transitions) == 0 {
		_, err := fmt.Fprintln(stdout, "no transitions taken yet (engines merge theirs every 10 s and on stop)")
		return err
	}
	fmt.Fprintln(stdout, "\ntransitions taken:")
	tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	for _, t := range g.Transitions {
		fmt.Fprintf(tw, "  %s → %s\t%s\t%d\n", p(t.From), p(t.To), p(t.Outcome), t.Count)
	}
	return tw.Flush()
}
