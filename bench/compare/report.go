package compare

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"text/tabwriter"
)

// Ratio is a ratio gendurable/river of medians; NaN (null in JSON) when a
// side is missing.
type Ratio float64

// MarshalJSON writes NaN and infinities as null.
func (r Ratio) MarshalJSON() ([]byte, error) {
	x := float64(r)
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(x)
}

func (r Ratio) String() string {
	x := float64(r)
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", x)
}

// CaseRatio is the jobs/s ratio of one throughput case.
type CaseRatio struct {
	Case  string `json:"case"` // setting, "x<procs>p" appended for several worker processes
	Ratio Ratio  `json:"ratio"`
}

// Report is everything a comparison measured.
type Report struct {
	Options OptionsSummary `json:"options"`

	Results []Result `json:"results"` // throughput runs
	Medians []Median `json:"medians"`

	Continuous        []ContinuousResult `json:"continuous"`
	ContinuousMedians []ContinuousMedian `json:"continuous_medians"`

	Inserts       []InsertResult `json:"inserts"`
	InsertMedians []InsertMedian `json:"insert_medians"`

	// Limits: the physical limit, once per throughput round (LimitResult).
	// LimitRowsPerSec is their median; LimitFraction* the best (one
	// process) median jobs/s of each system over the job ceiling
	// (LimitRowsPerSec / 2).
	Limits                  []LimitResult `json:"limits"`
	LimitRowsPerSec         Ratio         `json:"limit_rows_per_sec"`
	LimitFractionGendurable Ratio         `json:"limit_fraction_gendurable"`
	LimitFractionRiver      Ratio         `json:"limit_fraction_river"`

	// RatioInsert: the throughput runs' insert phase (River's path as
	// Options.RiverInsertFast says), every run of a system counted.
	RatioInsert Ratio `json:"ratio_insert_rows_per_sec"`
	// Insert mode: gendurable InsertMany against River's InsertMany and
	// InsertManyFast (COPY).
	RatioInsertMany     Ratio `json:"ratio_insert_many"`
	RatioInsertManyFast Ratio `json:"ratio_insert_many_fast"`
	// RatioJobs: jobs/s of every throughput case; RatioJobsBest is the
	// "best" case with one worker process (the headline).
	RatioJobs     []CaseRatio `json:"ratios_jobs_per_sec"`
	RatioJobsBest Ratio       `json:"ratio_jobs_per_sec"`
}

// Median is the median over rounds of one (system, throughput case).
type Median struct {
	System           string  `json:"system"`
	Case             string  `json:"case"`
	Setting          string  `json:"setting"`
	Procs            int     `json:"procs"`
	Rounds           int     `json:"rounds"`
	InsertRowsPerSec float64 `json:"insert_rows_per_sec"`
	JobsPerSec       float64 `json:"jobs_per_sec"`
	XactsPerJob      float64 `json:"xacts_per_job"`
	WALBytesPerJob   float64 `json:"wal_bytes_per_job"`
	ClientCPUMicros  float64 `json:"client_cpu_us_per_job"`
	MachineCPUMicros float64 `json:"machine_cpu_us_per_job"`
	Load1After       float64 `json:"load1_after"`
}

// ContinuousMedian is the median over rounds of one (system, rate).
type ContinuousMedian struct {
	System             string  `json:"system"`
	Rate               int     `json:"rate"`
	Rounds             int     `json:"rounds"`
	AchievedRate       float64 `json:"achieved_rate"`
	InsertCallP50Milli float64 `json:"insert_call_p50_ms"`
	PickupP50Milli     float64 `json:"pickup_p50_ms"`
	PickupP99Milli     float64 `json:"pickup_p99_ms"`
	CompleteP50Milli   float64 `json:"complete_p50_ms"`
	CompleteP99Milli   float64 `json:"complete_p99_ms"`
	IdlePickupMillis   float64 `json:"idle_pickup_ms"`
	IdleCompleteMillis float64 `json:"idle_complete_ms"`
}

// InsertMedian is the median over rounds of one insert path.
type InsertMedian struct {
	Path       string  `json:"path"`
	Rounds     int     `json:"rounds"`
	RowsPerSec float64 `json:"rows_per_sec"`
}

// OptionsSummary records what ran.
type OptionsSummary struct {
	Database             string            `json:"database"`
	Modes                []string          `json:"modes"`
	N                    int               `json:"n"`
	Rounds               int               `json:"rounds"`
	InsertBatch          int               `json:"insert_batch"`
	InsertN              int               `json:"insert_n"`
	Concurrent           bool              `json:"concurrent_insert"`
	RiverInsertFast      bool              `json:"river_insert_fast"`
	FreshStats           bool              `json:"fresh_stats"`
	StatsRows            int               `json:"stats_rows"`
	PoolConns            int32             `json:"pool_conns"`
	Cases                []string          `json:"cases"`
	Rates                []int             `json:"rates"`
	ContinuousSecs       float64           `json:"continuous_seconds"`
	ContinuousWarmupSecs float64           `json:"continuous_warmup_seconds"`
	IdleWaitSecs         float64           `json:"idle_wait_seconds"`
	Configs              map[string]string `json:"configs"` // "system/setting" → configuration
}

func summarize(o *Options) OptionsSummary {
	s := OptionsSummary{
		Database: o.Database, Modes: o.Modes, N: o.N, Rounds: o.Rounds, InsertBatch: o.InsertBatch,
		InsertN: o.insertN(), Concurrent: o.Concurrent, RiverInsertFast: o.RiverInsertFast,
		FreshStats: o.FreshStats, StatsRows: o.StatsRows, PoolConns: o.PoolConns,
		Rates: o.Rates, ContinuousSecs: o.ContinuousDuration.Seconds(), ContinuousWarmupSecs: o.ContinuousWarmup.Seconds(), IdleWaitSecs: o.IdleWait.Seconds(),
		Configs: map[string]string{},
	}
	if cfg, err := poolConfig(o, o.PoolConns, ""); err == nil {
		s.PoolConns = cfg.MaxConns
	}
	for _, sys := range []string{SystemRiver, SystemGendurable} {
		if o.hasMode(ModeThroughput) {
			for _, c := range o.cases() {
				s.Configs[sys+"/"+c.setting] = o.setting(c.setting).describe(sys)
			}
		}
		if o.hasMode(ModeContinuous) {
			s.Configs[sys+"/continuous"] = o.continuousSetting().describe(sys)
		}
	}
	if o.hasMode(ModeThroughput) {
		for _, c := range o.cases() {
			s.Cases = append(s.Cases, c.key())
		}
	}
	return s
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// collect gathers f over xs where keep holds.
func collect[T any](xs []T, keep func(T) bool, f func(T) float64) []float64 {
	var out []float64
	for _, x := range xs {
		if keep(x) {
			out = append(out, f(x))
		}
	}
	return out
}

func caseKey(r Result) string {
	return runCase{setting: r.Setting, procs: max(r.Procs, 1)}.key()
}

// finish computes medians and ratios from the runs.
func (r *Report) finish() {
	r.Medians = nil
	var cases []Result // first run of each case, in order
	for _, res := range r.Results {
		if !slices.ContainsFunc(cases, func(x Result) bool { return caseKey(x) == caseKey(res) }) {
			cases = append(cases, res)
		}
	}
	jobs := func(sys, key string) []float64 {
		return collect(r.Results, func(x Result) bool { return x.System == sys && caseKey(x) == key },
			func(x Result) float64 { return x.JobsPerSec })
	}
	r.RatioJobs = nil
	for _, c := range cases {
		key := caseKey(c)
		for _, sys := range []string{SystemRiver, SystemGendurable} {
			keep := func(x Result) bool { return x.System == sys && caseKey(x) == key }
			m := func(f func(Result) float64) float64 { return median(collect(r.Results, keep, f)) }
			js := jobs(sys, key)
			if len(js) == 0 {
				continue
			}
			r.Medians = append(r.Medians, Median{
				System: sys, Case: key, Setting: c.Setting, Procs: max(c.Procs, 1), Rounds: len(js),
				InsertRowsPerSec: m(func(x Result) float64 { return x.InsertRowsPerSec }),
				JobsPerSec:       median(js),
				XactsPerJob:      m(func(x Result) float64 { return x.XactsPerJob }),
				WALBytesPerJob:   m(func(x Result) float64 { return x.WALBytesPerJob }),
				ClientCPUMicros:  m(func(x Result) float64 { return x.ClientCPUMicrosPerJob }),
				MachineCPUMicros: m(func(x Result) float64 { return x.MachineCPUMicrosPerJob }),
				Load1After:       m(func(x Result) float64 { return x.Load1After }),
			})
		}
		r.RatioJobs = append(r.RatioJobs, CaseRatio{Case: key,
			Ratio: Ratio(median(jobs(SystemGendurable, key)) / median(jobs(SystemRiver, key)))})
	}
	best := runCase{setting: SettingBest, procs: 1}.key()
	r.RatioJobsBest = Ratio(median(jobs(SystemGendurable, best)) / median(jobs(SystemRiver, best)))
	// Inserting does not depend on the case: every run of a system counts.
	insert := func(sys string) float64 {
		return median(collect(r.Results, func(x Result) bool { return x.System == sys },
			func(x Result) float64 { return x.InsertRowsPerSec }))
	}
	r.RatioInsert = Ratio(insert(SystemGendurable) / insert(SystemRiver))
	limit := median(collect(r.Limits, func(LimitResult) bool { return true }, func(x LimitResult) float64 { return x.RowsPerSec }))
	r.LimitRowsPerSec = Ratio(limit)
	r.LimitFractionGendurable = Ratio(median(jobs(SystemGendurable, best)) / (limit / 2))
	r.LimitFractionRiver = Ratio(median(jobs(SystemRiver, best)) / (limit / 2))

	r.ContinuousMedians = nil
	var rates []int
	for _, c := range r.Continuous {
		if !slices.Contains(rates, c.Rate) {
			rates = append(rates, c.Rate)
		}
	}
	for _, rate := range rates {
		for _, sys := range []string{SystemRiver, SystemGendurable} {
			keep := func(x ContinuousResult) bool { return x.System == sys && x.Rate == rate }
			m := func(f func(ContinuousResult) float64) float64 { return median(collect(r.Continuous, keep, f)) }
			n := len(collect(r.Continuous, keep, func(ContinuousResult) float64 { return 0 }))
			if n == 0 {
				continue
			}
			r.ContinuousMedians = append(r.ContinuousMedians, ContinuousMedian{
				System: sys, Rate: rate, Rounds: n,
				AchievedRate:       m(func(x ContinuousResult) float64 { return x.AchievedRate }),
				InsertCallP50Milli: m(func(x ContinuousResult) float64 { return x.InsertCall.P50Milli }),
				PickupP50Milli:     m(func(x ContinuousResult) float64 { return x.Pickup.P50Milli }),
				PickupP99Milli:     m(func(x ContinuousResult) float64 { return x.Pickup.P99Milli }),
				CompleteP50Milli:   m(func(x ContinuousResult) float64 { return x.Complete.P50Milli }),
				CompleteP99Milli:   m(func(x ContinuousResult) float64 { return x.Complete.P99Milli }),
				IdlePickupMillis:   m(func(x ContinuousResult) float64 { return x.IdlePickupMillis }),
				IdleCompleteMillis: m(func(x ContinuousResult) float64 { return x.IdleCompleteMillis }),
			})
		}
	}

	r.InsertMedians = nil
	path := func(p string) []float64 {
		return collect(r.Inserts, func(x InsertResult) bool { return x.Path == p },
			func(x InsertResult) float64 { return x.RowsPerSec })
	}
	for _, p := range insertPaths {
		if xs := path(p); len(xs) > 0 {
			r.InsertMedians = append(r.InsertMedians, InsertMedian{Path: p, Rounds: len(xs), RowsPerSec: median(xs)})
		}
	}
	gd := median(path(PathGDInsertMany))
	r.RatioInsertMany = Ratio(gd / median(path(PathRiverInsertMany)))
	r.RatioInsertManyFast = Ratio(gd / median(path(PathRiverInsertManyFast)))
}

func fmtLoad(x float64) string {
	if x < 0 {
		return "?"
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

func percent(x Ratio) string {
	if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(x))
}

func fmtMillis(x float64) string {
	if x < 0 || math.IsNaN(x) {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', 1, 64)
}

// WriteText writes the tables, the medians and the ratio lines; the last
// line is always "ratio gendurable/river jobs_per_sec: X.XX".
func (r *Report) WriteText(w io.Writer) error {
	o := r.Options
	stats := fmt.Sprintf("realistic (jobs table filled with %d finished rows, ANALYZEd, then TRUNCATEd before every run)", o.StatsRows)
	if o.FreshStats {
		stats = "FRESH-STATS (schema recreated before every run, VACUUM ANALYZE while empty: no statistics; footnote figures)"
	}
	fmt.Fprintf(w, "statistics: %s\n", stats)
	fmt.Fprintf(w, "n=%d rounds=%d insert_batch=%d pool_conns=%d/process concurrent_insert=%v river_insert=%s database=%s\n",
		o.N, o.Rounds, o.InsertBatch, o.PoolConns, o.Concurrent, map[bool]string{false: "InsertMany", true: "InsertManyFast"}[o.RiverInsertFast], o.Database)
	keys := make([]string, 0, len(o.Configs))
	for k := range o.Configs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %-21s %s\n", k, o.Configs[k])
	}

	if len(r.Results) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "throughput: N jobs inserted, then worked by the worker processes; jobs/s = N / (first Start → last completion); load1 = 1-min load average before → after")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "system\tsetting\tprocs\tround\tstats done\tinsert rows/s\tjobs/s\twork s\tstart ms\tstop ms\txacts/job\tWAL B/job\tworker CPU µs/job\tmachine CPU µs/job\tload1\t")
		for _, res := range r.Results {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2f→%.2f\t%.0f\t%.0f\t%.2f\t%.0f\t%.0f\t%.3f\t%.0f\t%.0f\t%.0f\t%s→%s\t\n",
				res.System, res.Setting, res.Procs, res.Round, res.StatsFinishedFrac, res.StatsFinishedFracAfter, res.InsertRowsPerSec, res.JobsPerSec, res.WorkSeconds,
				res.StartMillis, res.StopMillis, res.XactsPerJob, res.WALBytesPerJob,
				res.ClientCPUMicrosPerJob, res.MachineCPUMicrosPerJob, fmtLoad(res.Load1Before), fmtLoad(res.Load1After))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "throughput medians over rounds:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "system\tsetting\tprocs\trounds\tinsert rows/s\tjobs/s\txacts/job\tWAL B/job\tworker CPU µs/job\tmachine CPU µs/job\tload1 after\t")
		for _, m := range r.Medians {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%.0f\t%.3f\t%.0f\t%.0f\t%.0f\t%s\t\n",
				m.System, m.Setting, m.Procs, m.Rounds, m.InsertRowsPerSec, m.JobsPerSec, m.XactsPerJob, m.WALBytesPerJob,
				m.ClientCPUMicros, m.MachineCPUMicros, fmtLoad(m.Load1After))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(r.Limits) > 0 {
		fmt.Fprintln(w)
		l := r.Limits[0]
		fmt.Fprintf(w, "physical limit: %d-row UPDATE … FROM unnest($1::bigint[]) by primary key changing an indexed status column, one transaction each, %d connections, %.0fs per round; a job costs two row writes: job ceiling = rows/s ÷ 2\n",
			l.Batch, l.Conns, l.Seconds)
		for _, x := range r.Limits {
			fmt.Fprintf(w, "  round %d: %.0f rows/s, ceiling %.0f jobs/s (load1 %s)\n", x.Round, x.RowsPerSec, x.JobCeiling, fmtLoad(x.Load1))
		}
		fmt.Fprintf(w, "  median %s rows/s: best jobs/s at %s (gendurable) and %s (River) of the ceiling\n",
			strconv.FormatFloat(float64(r.LimitRowsPerSec), 'f', 0, 64), percent(r.LimitFractionGendurable), percent(r.LimitFractionRiver))
	}

	if len(r.Continuous) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "continuous: producer process inserting at the rate for %gs (the first %gs a warm-up, not in the latencies), one worker process at library defaults (zero fields above: library defaults); latency ms from the producer's clock before its InsertMany call (whose own duration is \"insert call\") to the work function's entry (pickup) and to the completion event in the worker (complete); idle = one job after %gs idle\n",
			o.ContinuousSecs, o.ContinuousWarmupSecs, o.IdleWaitSecs)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "system\trate\tround\tstats done\tjobs\twarm-up\tachieved/s\tinsert call p50\tpickup p50\tpickup p99\tpickup max\tcomplete p50\tcomplete p99\tidle pickup\tidle complete\tload1\t")
		for _, c := range r.Continuous {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f→%.2f\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s→%s\t\n",
				c.System, c.Rate, c.Round, c.StatsFinishedFrac, c.StatsFinishedFracAfter, c.Inserted, c.WarmupJobs, c.AchievedRate, fmtMillis(c.InsertCall.P50Milli),
				fmtMillis(c.Pickup.P50Milli), fmtMillis(c.Pickup.P99Milli), fmtMillis(c.Pickup.MaxMilli),
				fmtMillis(c.Complete.P50Milli), fmtMillis(c.Complete.P99Milli),
				fmtMillis(c.IdlePickupMillis), fmtMillis(c.IdleCompleteMillis), fmtLoad(c.Load1Before), fmtLoad(c.Load1After))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "continuous medians over rounds (ms):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "system\trate\trounds\tachieved/s\tinsert call p50\tpickup p50\tpickup p99\tcomplete p50\tcomplete p99\tidle pickup\tidle complete\t")
		for _, m := range r.ContinuousMedians {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", m.System, m.Rate, m.Rounds, m.AchievedRate,
				fmtMillis(m.InsertCallP50Milli), fmtMillis(m.PickupP50Milli), fmtMillis(m.PickupP99Milli), fmtMillis(m.CompleteP50Milli), fmtMillis(m.CompleteP99Milli),
				fmtMillis(m.IdlePickupMillis), fmtMillis(m.IdleCompleteMillis))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(r.Inserts) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "insert: %d rows in batches of %d, no workers\n", o.InsertN, o.InsertBatch)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "path\tround\tstats done\trows/s\tseconds\tload1\t")
		for _, x := range r.Inserts {
			fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f\t%.2f\t%s\t\n", x.Path, x.Round, x.StatsFinishedFrac, x.RowsPerSec, x.Seconds, fmtLoad(x.Load1))
		}
		for _, m := range r.InsertMedians {
			fmt.Fprintf(tw, "%s\tmedian\t\t%.0f\t\t\t\n", m.Path, m.RowsPerSec)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w)
	if len(r.Results) > 0 {
		fmt.Fprintf(w, "ratio gendurable/river insert_rows_per_sec: %s\n", r.RatioInsert)
	}
	if len(r.Inserts) > 0 {
		fmt.Fprintf(w, "ratio gendurable/river insert_rows_per_sec@InsertMany: %s\n", r.RatioInsertMany)
		fmt.Fprintf(w, "ratio gendurable/river insert_rows_per_sec@InsertManyFast: %s\n", r.RatioInsertManyFast)
	}
	for _, c := range r.RatioJobs {
		if c.Case != SettingBest {
			fmt.Fprintf(w, "ratio gendurable/river jobs_per_sec@%s: %s\n", c.Case, c.Ratio)
		}
	}
	_, err := fmt.Fprintf(w, "ratio gendurable/river jobs_per_sec: %s\n", r.RatioJobsBest)
	return err
}

// WriteJSON writes the report as one JSON object (NaN ratios as null).
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
