package longhorizon

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// WriteOutputs writes, under rep.Options.Out: per system <system>/samples.csv
// (merged, one row per sample instant) and <system>/db.jsonl (raw database
// samples; <system>/adapter.jsonl, the raw adapter lines, is written during
// the run); run.json (settings, phases, crash and drain results);
// summary.md (per-phase medians and p95s, ready for BENCHMARKS.md); and the
// plots latency_p95.png, completion.png, dead_tuples.png, table_size.png.
func WriteOutputs(rep *Report) error {
	out := rep.Options.Out
	for _, r := range rep.Runs {
		dir := filepath.Join(out, r.System)
		if err := writeCSV(filepath.Join(dir, "samples.csv"), r); err != nil {
			return err
		}
		if err := writeDBJSONL(filepath.Join(dir, "db.jsonl"), r); err != nil {
			return err
		}
	}
	if err := writeRunJSON(filepath.Join(out, "run.json"), rep); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(out, "summary.md"))
	if err != nil {
		return err
	}
	if err := WriteSummary(f, rep); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return writePlots(out, rep)
}

func writeCSV(path string, r *SystemRun) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(append([]string{"t", "elapsed_s", "phase"}, Columns...))
	for _, x := range r.Samples {
		row := []string{x.T.UTC().Format(time.RFC3339), strconv.FormatFloat(x.Elapsed, 'f', 1, 64), x.Phase}
		for _, c := range Columns {
			v := x.V[c]
			if math.IsNaN(v) {
				row = append(row, "")
			} else {
				row = append(row, strconv.FormatFloat(v, 'g', 6, 64))
			}
		}
		_ = w.Write(row)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeDBJSONL(path string, r *SystemRun) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	for _, ds := range r.DBSamples {
		_ = enc.Encode(map[string]any{"t": ds.T.UTC().Format(time.RFC3339), "phase": r.phaseAt(ds.T),
			"tables": ds.Tables, "wal_bytes": ds.WALBytes, "xmin_age": ds.XminAge})
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// num formats v with about three significant figures; "–" for NaN.
func num(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "–"
	case a >= 100 || a == 0:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

// medP95 is "median / p95" of vals scaled by div.
func medP95(vals []float64, div float64) string {
	return num(quantile(vals, 0.5)/div) + " / " + num(quantile(vals, 0.95)/div)
}

const mb = 1 << 20

// WriteSummary writes the per-phase tables of every system (cells are
// "median / p95" over the phase's samples) and, for two or more systems, a
// side-by-side table of medians.
func WriteSummary(w io.Writer, rep *Report) error {
	o := rep.Options
	bw := bufio.NewWriter(w)
	var ran []string
	for _, r := range rep.Runs {
		ran = append(ran, r.System)
	}
	fmt.Fprintf(bw, "<!-- long-horizon driver: %s; systems %s -->\n\n", time.Now().UTC().Format(time.RFC3339), strings.Join(ran, ", "))
	if len(ran) < len(o.Systems) {
		fmt.Fprintf(bw, "Cut short: only %s ran to the end of %s.\n\n", strings.Join(ran, ", "), strings.Join(o.Systems, ", "))
	}
	fmt.Fprintf(bw, "Settings: %g jobs/s offered in total (%d replicas × %g), %d workers per replica, %d ms jobs, %d-byte payloads, "+
		"high-load %g×, %d readers, samples every %v, phase lengths × %g.\n\n",
		o.Rate, o.Replicas, o.Rate/float64(max(o.Replicas, 1)), o.Workers, o.WorkMS, o.PayloadBytes,
		o.HighLoadFactor, o.Readers, o.SampleEvery, o.Scale)
	for _, r := range rep.Runs {
		writeSystemSummary(bw, r)
	}
	if len(rep.Runs) > 1 {
		writeComparison(bw, rep.Runs)
	}
	return bw.Flush()
}

func writeSystemSummary(w io.Writer, r *SystemRun) {
	fmt.Fprintf(w, "### %s\n\n", r.System)
	fmt.Fprintln(w, "Cells: median / p95 over the phase's samples (autovacuums: runs during the phase).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| phase | minutes | offered/s | completion/s | completion ÷ offered | claim p95 ms | claim p99 ms | queue depth | dead tuples | table+index MB | WAL MB/s | autovacuums |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, sp := range r.Spans {
		p := sp.Name
		ratio := quantile(r.phaseValues(p, "completion_rate"), 0.5) / quantile(r.phaseValues(p, "offered"), 0.5)
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s %% | %s | %s | %s | %s | %s | %s | %s |\n", p,
			num(sp.End.Sub(sp.Start).Minutes()),
			num(quantile(r.phaseValues(p, "offered"), 0.5)),
			medP95(r.phaseValues(p, "completion_rate"), 1),
			num(100*ratio),
			medP95(r.phaseValues(p, "claim_p95_ms"), 1),
			medP95(r.phaseValues(p, "claim_p99_ms"), 1),
			medP95(r.phaseValues(p, "queue_depth"), 1),
			medP95(r.phaseValues(p, "dead_tuples"), 1),
			medP95(r.phaseValues(p, "total_bytes"), mb),
			medP95(r.phaseValues(p, "wal_bytes_per_s"), mb),
			num(r.delta(p, "autovacuum_count")))
	}
	fmt.Fprintln(w)
	warm := r.lastValue(PhaseWarmup, "total_bytes")
	end := math.NaN()
	if n := len(r.Spans); n > 0 {
		end = r.lastValue(r.Spans[n-1].Name, "total_bytes")
	}
	fmt.Fprintf(w, "- Event tables %s: table + index %s MB after warmup, %s MB at the end (%s×).\n",
		strings.Join(r.Descriptor.EventTables, ", "), num(warm/mb), num(end/mb), num(end/warm))
	if hold, ok := r.span(PhaseIdleInTx); ok {
		cleanP95 := quantile(r.phaseValues(PhaseClean, "claim_p95_ms"), 0.95)
		back := r.secondsUntil(hold.EndS, func(x Sample) bool { return x.V["claim_p95_ms"] <= cleanP95 })
		fmt.Fprintf(w, "- Claim p95 back within the clean phase's range (≤ %s ms, its p95) %s s after the idle-in-tx holder ended.\n",
			num(cleanP95), num(back))
	}
	if r.KillS > 0 {
		back := r.secondsUntil(r.KillS, func(x Sample) bool {
			return x.V["completion_rate"] >= 0.99*x.V["enqueue_rate"]
		})
		fmt.Fprintf(w, "- Crash: a replica SIGKILLed at %s s, restarted at %s s; completion ≥ 99 %% of enqueue again %s s after the kill (sample resolution).\n",
			num(r.KillS), num(r.RestartS), num(back))
		if k := r.KillDrain; k.Counted {
			fmt.Fprintf(w, "- Every job inserted before the SIGKILL finished %s s after it (%d still unfinished, %d failed; polled every second).\n",
				num(k.WaitedS), k.Pending, k.Failed)
		} else {
			fmt.Fprintf(w, "- Jobs inserted before the SIGKILL: not counted (%s).\n", k.Note)
		}
	}
	if r.Drain.Counted {
		fmt.Fprintf(w, "- Lost: %d jobs inserted before the end of the last phase still unfinished after a %s s drain; %d failed (the system's own table).\n",
			r.Drain.Pending, num(r.Drain.WaitedS), r.Drain.Failed)
	} else {
		fmt.Fprintf(w, "- Lost: not counted (%s).\n", r.Drain.Note)
	}
	fmt.Fprintf(w, "- Adapter totals (Σ rate × window over every replica; a killed replica's last window is missing): inserted %s, completed %s.\n",
		num(r.Inserted), num(r.Completed))
	clean, worst := 0, 0.0
	for _, s := range r.Stops {
		if s.Clean {
			clean++
		}
		worst = max(worst, s.TookS)
	}
	fmt.Fprintf(w, "- SIGTERM at the end: %d of %d replicas exited 0 within 5 s (slowest %s s).\n", clean, len(r.Stops), num(worst))
	if len(r.ProtoErrors) > 0 {
		fmt.Fprintf(w, "- Protocol errors: %s.\n", strings.Join(r.ProtoErrors, "; "))
	}
	if len(r.Problems) > 0 {
		fmt.Fprintf(w, "- Problems: %s.\n", strings.Join(r.Problems, "; "))
	}
	fmt.Fprintln(w)
}

func writeComparison(w io.Writer, runs []*SystemRun) {
	fmt.Fprintln(w, "### Side by side (medians per phase)")
	fmt.Fprintln(w)
	head, sep := "| phase |", "|---|"
	for _, col := range []string{"completion ÷ offered", "claim p95 ms", "dead tuples", "table+index MB"} {
		for _, r := range runs {
			head += " " + r.System + " " + col + " |"
			sep += "---:|"
		}
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, sep)
	for _, sp := range runs[0].Spans {
		p := sp.Name
		row := "| " + p + " |"
		for _, r := range runs {
			row += " " + num(100*quantile(r.phaseValues(p, "completion_rate"), 0.5)/quantile(r.phaseValues(p, "offered"), 0.5)) + " % |"
		}
		for _, c := range []struct {
			col string
			div float64
		}{{"claim_p95_ms", 1}, {"dead_tuples", 1}, {"total_bytes", mb}} {
			for _, r := range runs {
				row += " " + num(quantile(r.phaseValues(p, c.col), 0.5)/c.div) + " |"
			}
		}
		fmt.Fprintln(w, row)
	}
	fmt.Fprintln(w)
}
