package gendurable

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/maintenance"
	"github.com/gendurable/gendurable/internal/sqlq"
)

// This file gives every process the whole picture of every machine
// (docs/design.md §9): each engine stores the definitions of the machines
// it registers when it starts, and merges the transitions its steps took
// into them now and then; the graph reads them back, so a process that
// registers nothing (the CLI, a standalone dashboard) draws every machine.

// observedFlushInterval is how often an engine merges the transitions its
// steps took into the stored definitions (and once more on Stop).
const observedFlushInterval = 10 * time.Second

// MaxMachines bounds the stored machine versions [Engine.ListMachines]
// returns.
const MaxMachines = 1000

// MachineGraph is a machine's steps with how many instances sit at each
// (by status), its declared transitions and the transitions its instances
// took, as stored in the database by every engine that registers it.
type MachineGraph struct {
	Machine string `json:"machine"`
	// Versions known: stored by an engine that started with them, or
	// registered in this one.
	Versions []int `json:"versions"`
	// Registered are the versions registered in this engine.
	Registered []int `json:"registered,omitempty"`
	// Steps in the order the machine declares them: its newest version's
	// Start, then its Flow order, then the rest by name; then steps only
	// older versions have; then steps only found in the instance table.
	Steps []string `json:"steps"`
	Start string   `json:"start"`
	// Counts: instances now at each step, by status (step → status → count).
	Counts map[string]map[Status]int64 `json:"counts"`
	// Parked: instances waiting at each step — for a signal or children
	// (at the step they run when woken: the row's step), or runnable later,
	// backing off after a failure or delayed on purpose.
	Parked map[string]Parked `json:"parked,omitempty"`
	// Declared: the transitions the machine's Flow allows (every version's).
	Declared []DeclaredTransition `json:"declared,omitempty"`
	// Transitions taken, counted by every engine that ran the machine's
	// steps: merged into the database every 10 s and on Stop, plus what
	// this engine has not merged yet.
	Transitions []Transition `json:"transitions"`
	// UpdatedAt: when the newest version's stored definition last changed;
	// nil if it is not stored.
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
}

// Parked counts the instances waiting at one step.
type Parked struct {
	Signal     int64 `json:"signal,omitempty"`      // awaiting a signal
	Children   int64 `json:"children,omitempty"`    // awaiting children
	BackingOff int64 `json:"backing_off,omitempty"` // runnable after a retry delay (attempt > 0)
	Delayed    int64 `json:"delayed,omitempty"`     // runnable later on purpose (attempt 0)
}

// Total is the sum of the counts.
func (p Parked) Total() int64 { return p.Signal + p.Children + p.BackingOff + p.Delayed }

// Transition counts outcomes from one step to the next.
type Transition struct {
	From    string `json:"from"`
	To      string `json:"to"`      // a step, or "done" / "failed"
	Outcome string `json:"outcome"` // next, replay, done, stop, await or children
	Count   int64  `json:"count"`
}

// DeclaredTransition is one edge a machine's Flow allows.
type DeclaredTransition struct {
	From  string   `json:"from"`
	To    string   `json:"to"`    // a step, or "done"
	Kinds []string `json:"kinds"` // next, await, children; or done
}

// MachineInfo is one version of a machine as stored, or registered here.
type MachineInfo struct {
	Name    string   `json:"name"`
	Version int      `json:"version"`
	Start   string   `json:"start"`
	Steps   []string `json:"steps"`
	// Flow: the machine declares its transitions.
	Flow bool `json:"flow"`
	// Registered in this engine.
	Registered bool `json:"registered"`
	// Stored: an engine that registers it has started (the times below
	// are set).
	Stored       bool       `json:"stored"`
	RegisteredAt *time.Time `json:"registered_at,omitempty"` // first stored
	UpdatedAt    *time.Time `json:"updated_at,omitempty"`    // definition last changed
	SeenAt       *time.Time `json:"seen_at,omitempty"`       // last start of an engine registering it
}

// ListMachines returns every machine version stored in the database (up to
// MaxMachines) and those registered in this engine, by name and version.
func (e *Engine) ListMachines(ctx context.Context) ([]MachineInfo, error) {
	if err := e.usable(ctx, "ListMachines"); err != nil {
		return nil, err
	}
	stored, err := e.q.StoredMachines(ctx, e.pool, nil, MaxMachines)
	if err != nil {
		return nil, e.dbErr(ctx, err, "list machines")
	}
	byKey := map[machineKey]*MachineInfo{}
	var out []*MachineInfo
	for i := range stored {
		s := &stored[i]
		mi := &MachineInfo{Name: s.Name, Version: s.Version, Start: s.Start, Steps: s.Steps, Flow: s.Flow != nil,
			Stored: true, RegisteredAt: &s.RegisteredAt, UpdatedAt: &s.UpdatedAt, SeenAt: &s.SeenAt}
		byKey[machineKey{s.Name, s.Version}] = mi
		out = append(out, mi)
	}
	for k, core := range e.registry {
		if mi := byKey[k]; mi != nil {
			mi.Registered = true
			continue
		}
		out = append(out, &MachineInfo{Name: k.name, Version: k.version, Start: core.start,
			Steps: slices.Clone(core.order), Flow: core.flow != nil, Registered: true})
	}
	slices.SortFunc(out, func(a, b *MachineInfo) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Version, b.Version))
	})
	res := make([]MachineInfo, len(out))
	for i, mi := range out {
		res[i] = *mi
	}
	return res, nil
}

// Graph returns the graph of a machine (by name) from its stored
// definitions, the ones registered in this engine and the instance table:
// [ErrNotFound] if it is in none of them, [ErrInvalidInput] for a name no
// machine can have (see [ListFilter]). It reads the machine's stored
// definitions (by primary key) and counts its instances by step and status
// (a full count of the machine's rows, like [Engine.Queues]).
func (e *Engine) Graph(ctx context.Context, machine string) (*MachineGraph, error) {
	if err := e.usable(ctx, "Graph"); err != nil {
		return nil, err
	}
	if err := checkName("machine name", machine); err != nil {
		return nil, err
	}
	g := &MachineGraph{Machine: machine, Counts: map[string]map[Status]int64{}, Parked: map[string]Parked{}}
	stored, err := e.q.StoredMachines(ctx, e.pool, &machine, MaxMachines)
	if err != nil {
		return nil, e.dbErr(ctx, err, fmt.Sprintf("graph %q", machine))
	}
	// One definition per version: this engine's registered one wins over
	// the stored copy (they are equal once it started).
	type version struct {
		start string
		steps []string
		flow  []sqlq.FlowRule
	}
	versions := map[int]version{}
	observed := map[[3]string]int64{}
	for _, s := range stored {
		versions[s.Version] = version{s.Start, s.Steps, s.Flow}
		for _, o := range s.Observed {
			observed[[3]string{o.From, o.To, o.Outcome}] += o.Count
		}
		t := s.UpdatedAt // stored by version: the newest comes last
		g.UpdatedAt = &t
	}
	for k, core := range e.registry {
		if k.name != machine {
			continue
		}
		def := core.def()
		versions[k.version] = version{def.Start, def.Steps, def.Flow}
		g.Registered = append(g.Registered, k.version)
	}
	for k, n := range e.trans.pendingOf(machine) {
		observed[k] += n
	}
	g.Versions = slices.Sorted(func(yield func(int) bool) {
		for v := range versions {
			if !yield(v) {
				return
			}
		}
	})
	slices.Sort(g.Registered)

	// Steps: the newest version's order first, then older versions'.
	seen := map[string]bool{}
	addStep := func(s string) {
		if !seen[s] {
			seen[s] = true
			g.Steps = append(g.Steps, s)
		}
	}
	declared := map[[2]string]map[string]bool{}
	var declOrder [][2]string
	for i := len(g.Versions) - 1; i >= 0; i-- {
		v := versions[g.Versions[i]]
		if g.Start == "" {
			g.Start = v.start
		}
		for _, s := range v.steps {
			addStep(s)
		}
		for _, r := range v.flow {
			for _, kind := range r.Kinds {
				targets := r.To
				if kind == "done" {
					targets = []string{"done"}
				}
				for _, to := range targets {
					k := [2]string{r.Step, to}
					if declared[k] == nil {
						declared[k] = map[string]bool{}
						declOrder = append(declOrder, k)
					}
					declared[k][kind] = true
				}
			}
		}
	}
	for _, k := range declOrder {
		d := DeclaredTransition{From: k[0], To: k[1]}
		for _, kind := range []string{"next", "await", "children", "done"} {
			if declared[k][kind] {
				d.Kinds = append(d.Kinds, kind)
			}
		}
		g.Declared = append(g.Declared, d)
	}

	rows, err := e.q.StepCounts(ctx, e.pool, machine)
	if err != nil {
		return nil, e.dbErr(ctx, err, fmt.Sprintf("graph %q", machine))
	}
	var tableOnly []string
	for _, r := range rows {
		if !seen[r.Step] {
			seen[r.Step] = true
			tableOnly = append(tableOnly, r.Step)
		}
		if g.Counts[r.Step] == nil {
			g.Counts[r.Step] = map[Status]int64{}
		}
		g.Counts[r.Step][Status(r.Status)] = r.Count
		p := g.Parked[r.Step]
		switch Status(r.Status) {
		case StatusAwaitingSignal:
			p.Signal = r.Count
		case StatusAwaitingChildren:
			p.Children = r.Count
		}
		p.BackingOff += r.BackingOff
		p.Delayed += r.Delayed
		if p.Total() > 0 {
			g.Parked[r.Step] = p
		}
	}
	sort.Strings(tableOnly)
	g.Steps = append(g.Steps, tableOnly...)
	if len(g.Steps) == 0 {
		return nil, &machineNotFoundError{machine}
	}
	for k, n := range observed {
		g.Transitions = append(g.Transitions, Transition{From: k[0], To: k[1], Outcome: k[2], Count: n})
	}
	slices.SortFunc(g.Transitions, func(a, b Transition) int {
		return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To), cmp.Compare(a.Outcome, b.Outcome))
	})
	if g.Transitions == nil {
		g.Transitions = []Transition{}
	}
	if g.Versions == nil { // only in the instance table: no version known
		g.Versions = []int{}
	}
	return g, nil
}

// machineNotFoundError is Graph's [ErrNotFound], worded for a machine
// rather than an instance.
type machineNotFoundError struct{ name string }

func (e *machineNotFoundError) Error() string {
	return fmt.Sprintf("gendurable: machine not found: no machine %q is stored, registered here or in the table", e.name)
}

// Is makes errors.Is(err, ErrNotFound) hold.
func (e *machineNotFoundError) Is(target error) bool { return target == ErrNotFound }

// def is the definition an engine stores for core.
func (core *machineCore) def() sqlq.MachineDef {
	d := sqlq.MachineDef{Name: core.name, Version: core.version, Start: core.start, Steps: slices.Clone(core.order)}
	if core.flow == nil {
		return d
	}
	d.Flow = []sqlq.FlowRule{}
	for _, s := range core.order {
		if r := core.flow[s]; r != nil {
			d.Flow = append(d.Flow, sqlq.FlowRule{Step: s, To: slices.Clone(r.to), Kinds: r.kinds.names()})
		}
	}
	return d
}

// storeDefinitions writes the definitions of every registered machine in
// one statement (Start calls it). A stored definition that differs from
// ours under the same version is replaced, with a warning: its steps or
// Flow changed without a Version bump.
func (e *Engine) storeDefinitions(ctx context.Context) error {
	if len(e.registry) == 0 {
		return nil
	}
	defs := make([]sqlq.MachineDef, 0, len(e.registry))
	for _, core := range e.registry {
		defs = append(defs, core.def())
	}
	slices.SortFunc(defs, func(a, b sqlq.MachineDef) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Version, b.Version))
	})
	changed, err := e.q.UpsertMachines(ctx, e.pool, defs)
	if err != nil {
		return err
	}
	for _, c := range changed {
		e.log.Warn("gendurable: the stored definition of this machine version differed (steps, Start or Flow changed without a new Version); replaced by this engine's",
			"machine", c.Name, "version", c.Version)
	}
	return nil
}

// flushObserved merges the transitions taken since the last flush into
// the stored definitions: one statement, none when nothing ran. On failure
// the counts are kept for the next flush.
func (e *Engine) flushObserved(ctx context.Context) error {
	pending := e.trans.take()
	if len(pending) == 0 {
		return nil
	}
	deltas := make([]sqlq.ObservedDelta, 0, len(pending))
	for k, n := range pending {
		deltas = append(deltas, sqlq.ObservedDelta{Name: k.machine, Version: k.version, From: k.from, To: k.to, Outcome: k.outcome, Count: n})
	}
	slices.SortFunc(deltas, func(a, b sqlq.ObservedDelta) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Version, b.Version))
	})
	if err := e.q.MergeObserved(ctx, e.pool, deltas); err != nil {
		// Put back only when the statement surely did not commit: the
		// server refused it, or it was never sent. Cut short by its context
		// or its connection, it may have committed, and putting the counts
		// back would count them twice (a Stop landing on a flush did); they
		// are dropped then — the counts are a picture, which may miss some,
		// not an audit.
		if sqlq.NotCommitted(err) {
			e.trans.putBack(pending)
		}
		return fmt.Errorf("merging observed transitions: %w", err)
	}
	return nil
}

// observedFlusher is the maintenance service that runs flushObserved.
func (e *Engine) observedFlusher() maintenance.Service {
	return &maintenance.Flusher{Name: "merging observed transitions", Interval: observedFlushInterval,
		Flush: e.flushObserved, Log: e.log, StatementTimeout: e.cfg.MaintenanceTimeout}
}

// transitionKey is one transition of one machine version.
type transitionKey struct {
	machine           string
	version           int
	from, to, outcome string
}

// transitions counts the transitions this engine's steps took since its
// last flush: a map increment per step, never a statement.
type transitions struct {
	mu      sync.Mutex
	pending map[transitionKey]int64
}

func (t *transitions) add(machine string, version int, from, to, outcome string) {
	t.mu.Lock()
	if t.pending == nil {
		t.pending = map[transitionKey]int64{}
	}
	t.pending[transitionKey{machine, version, from, to, outcome}]++
	t.mu.Unlock()
}

// take returns the pending counts and starts afresh.
func (t *transitions) take() map[transitionKey]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.pending
	t.pending = nil
	return p
}

// putBack adds counts a failed flush could not write.
func (t *transitions) putBack(p map[transitionKey]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending == nil {
		t.pending = map[transitionKey]int64{}
	}
	for k, n := range p {
		t.pending[k] += n
	}
}

// pendingOf returns the pending counts of one machine, every version.
func (t *transitions) pendingOf(machine string) map[[3]string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[[3]string]int64{}
	for k, n := range t.pending {
		if k.machine == machine {
			out[[3]string{k.from, k.to, k.outcome}] += n
		}
	}
	return out
}
