// Command long-horizon runs the long-horizon benchmark of issue 15: each
// system's adapter (a process speaking the adapter protocol, see package
// longhorizon) through warmup, clean, idle-in-tx, recovery, active-readers,
// high-load, recovery, kill-worker and start-worker on one PostgreSQL, one
// system at a time, and writes raw samples, a Markdown summary and PNG plots.
//
//	make long-horizon SYSTEM=both SCALE=0.05          # from the repo root
//	long-horizon -system both -scale 0.05 \
//	    -gendurable-cmd 'bin/gendurable bench --long-horizon' -river-cmd bin/river-long-horizon
//
// bench/README.md ("Long horizon") has the method and every output.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gendurable/gendurable/bench/longhorizon"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "long-horizon:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("long-horizon", flag.ContinueOnError)
	var o longhorizon.Options
	fs.StringVar(&o.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "maintenance connection (postgres:// URL); default $DATABASE_URL, else the local server")
	system := fs.String("system", "gendurable", "gendurable, river, both, or a comma-separated list, run in that order")
	gdCmd := fs.String("gendurable-cmd", "gendurable bench --long-horizon", "gendurable's adapter command (the process itself, split on spaces)")
	riverCmd := fs.String("river-cmd", "river-long-horizon", "River's adapter command (the process itself, split on spaces)")
	fs.Float64Var(&o.Rate, "rate", 200, "total offered jobs/s, split evenly between the replicas")
	fs.IntVar(&o.Workers, "workers", 8, "WORKER_COUNT of each replica")
	fs.IntVar(&o.Replicas, "replicas", 2, "adapter processes per system")
	fs.Float64Var(&o.Scale, "scale", 1, "multiplies every phase's duration (0.05: a smoke run); a phase lasts at least 1 s")
	fs.StringVar(&o.Out, "out", "long-horizon-out", "output directory")
	sample := fs.Int("sample-every", 5, "SAMPLE_EVERY_S: the adapters' and the driver's sample period, seconds")
	fs.IntVar(&o.PayloadBytes, "payload-bytes", 256, "JOB_PAYLOAD_BYTES")
	fs.IntVar(&o.WorkMS, "work-ms", 1, "JOB_WORK_MS")
	fs.Float64Var(&o.HighLoadFactor, "high-load-factor", 1.5, "rate multiplier of the high-load phase")
	fs.IntVar(&o.Readers, "readers", 4, "REPEATABLE READ scanners of the active-readers phase")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", 150*time.Second, "after the last phase, how long to wait for every job inserted before it to finish (not scaled)")
	fs.StringVar(&o.DBPrefix, "db-prefix", "lh_", "each system runs in database <prefix><system>, dropped and created afresh (only if this driver created it)")
	fs.BoolVar(&o.KeepDB, "keep-db", false, "keep each system's database after its run")
	durations := fs.String("durations", "", "full-length phase durations to override, e.g. clean=5m,idle-in-tx=20m (before -scale)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch *system {
	case "both":
		o.Systems = []string{"gendurable", "river"}
	default:
		for _, s := range strings.Split(*system, ",") {
			if s = strings.TrimSpace(s); s != "" {
				o.Systems = append(o.Systems, s)
			}
		}
	}
	o.Commands = map[string][]string{"gendurable": strings.Fields(*gdCmd), "river": strings.Fields(*riverCmd)}
	o.SampleEvery = time.Duration(*sample) * time.Second
	if *durations != "" {
		phases, err := overridePhases(longhorizon.DefaultPhases(), *durations)
		if err != nil {
			return err
		}
		o.Phases = phases
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := longhorizon.Run(ctx, o)
	if err != nil {
		if rep != nil && rep.Partial {
			fmt.Fprintf(os.Stderr, "long-horizon: cut short; wrote the outputs of the systems that finished to %s\n", rep.Options.Out)
		}
		return err
	}
	fmt.Fprintf(os.Stderr, "long-horizon: wrote %s/{summary.md,run.json,*.png,<system>/samples.csv,...}\n", rep.Options.Out)
	return longhorizon.WriteSummary(os.Stdout, rep)
}

// overridePhases sets the durations named in spec (name=duration,...).
func overridePhases(phases []longhorizon.Phase, spec string) ([]longhorizon.Phase, error) {
	for _, kv := range strings.Split(spec, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		d, err := time.ParseDuration(val)
		if !ok || err != nil || d < 0 {
			return nil, fmt.Errorf("%w: -durations: %q: want phase=duration", longhorizon.ErrInvalidOption, kv)
		}
		found := false
		for i := range phases {
			if phases[i].Name == name {
				phases[i].Duration, found = d, true
			}
		}
		if !found {
			return nil, fmt.Errorf("%w: -durations: unknown phase %q", longhorizon.ErrInvalidOption, name)
		}
	}
	return phases, nil
}
