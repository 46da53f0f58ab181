package compare

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
)

// Report is everything a comparison measured.
type Report struct {
	Options OptionsSummary `json:"options"`
	Results []Result       `json:"results"`
	Medians []Median       `json:"medians"`
	// Ratios gendurable/river of medians; NaN (null in JSON) when a side is missing.
	RatioInsert    float64 `json:"ratio_insert_rows_per_sec"`
	RatioJobsBest  float64 `json:"ratio_jobs_per_sec"`
	RatioJobsEqual float64 `json:"ratio_jobs_per_sec_equal"`
}

// Median is the median over rounds of one (system, setting).
type Median struct {
	System           string  `json:"system"`
	Setting          string  `json:"setting"`
	Rounds           int     `json:"rounds"`
	InsertRowsPerSec float64 `json:"insert_rows_per_sec"`
	JobsPerSec       float64 `json:"jobs_per_sec"`
	XactsPerJob      float64 `json:"xacts_per_job"`
	WALBytesPerJob   float64 `json:"wal_bytes_per_job"`
	ClientCPUMicros  float64 `json:"client_cpu_us_per_job"`
	MachineCPUMicros float64 `json:"machine_cpu_us_per_job"`
}

// OptionsSummary records what ran.
type OptionsSummary struct {
	Database        string            `json:"database"`
	N               int               `json:"n"`
	Rounds          int               `json:"rounds"`
	InsertBatch     int               `json:"insert_batch"`
	Concurrent      bool              `json:"concurrent_insert"`
	RiverInsertFast bool              `json:"river_insert_fast"`
	PoolConns       int32             `json:"pool_conns"`
	Configs         map[string]string `json:"configs"` // "system/setting" → configuration
}

func summarize(o *Options) OptionsSummary {
	s := OptionsSummary{
		Database: o.Database, N: o.N, Rounds: o.Rounds, InsertBatch: o.InsertBatch,
		Concurrent: o.Concurrent, RiverInsertFast: o.RiverInsertFast, PoolConns: o.PoolConns,
		Configs: map[string]string{},
	}
	if cfg, err := poolConfig(o, o.PoolConns, ""); err == nil {
		s.PoolConns = cfg.MaxConns
	}
	for _, name := range o.Settings {
		st := o.setting(name)
		for _, sys := range []string{SystemRiver, SystemGendurable} {
			s.Configs[sys+"/"+name] = st.describe(sys)
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

func (r *Report) collect(system, setting string, f func(Result) float64) []float64 {
	var xs []float64
	for _, res := range r.Results {
		if res.System == system && (setting == "" || res.Setting == setting) {
			xs = append(xs, f(res))
		}
	}
	return xs
}

func jobsPerSec(r Result) float64 { return r.JobsPerSec }
func insertRate(r Result) float64 { return r.InsertRowsPerSec }

// finish computes medians and ratios from Results.
func (r *Report) finish() {
	r.Medians = nil
	for _, setting := range []string{SettingBest, SettingEqual} {
		for _, sys := range []string{SystemRiver, SystemGendurable} {
			jobs := r.collect(sys, setting, jobsPerSec)
			if len(jobs) == 0 {
				continue
			}
			r.Medians = append(r.Medians, Median{
				System: sys, Setting: setting, Rounds: len(jobs),
				InsertRowsPerSec: median(r.collect(sys, setting, insertRate)),
				JobsPerSec:       median(jobs),
				XactsPerJob:      median(r.collect(sys, setting, func(x Result) float64 { return x.XactsPerJob })),
				WALBytesPerJob:   median(r.collect(sys, setting, func(x Result) float64 { return x.WALBytesPerJob })),
				ClientCPUMicros:  median(r.collect(sys, setting, func(x Result) float64 { return x.ClientCPUMicrosPerJob })),
				MachineCPUMicros: median(r.collect(sys, setting, func(x Result) float64 { return x.MachineCPUMicrosPerJob })),
			})
		}
	}
	// Inserting does not depend on the setting: every run of a system counts.
	r.RatioInsert = median(r.collect(SystemGendurable, "", insertRate)) / median(r.collect(SystemRiver, "", insertRate))
	r.RatioJobsBest = median(r.collect(SystemGendurable, SettingBest, jobsPerSec)) / median(r.collect(SystemRiver, SettingBest, jobsPerSec))
	r.RatioJobsEqual = median(r.collect(SystemGendurable, SettingEqual, jobsPerSec)) / median(r.collect(SystemRiver, SettingEqual, jobsPerSec))
}

func fmtRatio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", x)
}

// WriteText writes the table, the medians and the ratio lines; the last line
// is always "ratio gendurable/river jobs_per_sec: X.XX".
func (r *Report) WriteText(w io.Writer) error {
	o := r.Options
	fmt.Fprintf(w, "n=%d rounds=%d insert_batch=%d pool_conns=%d concurrent_insert=%v river_insert=%s database=%s\n",
		o.N, o.Rounds, o.InsertBatch, o.PoolConns, o.Concurrent, map[bool]string{false: "InsertMany", true: "InsertManyFast"}[o.RiverInsertFast], o.Database)
	keys := make([]string, 0, len(o.Configs))
	for k := range o.Configs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %-17s %s\n", k, o.Configs[k])
	}
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tsetting\tround\tinsert rows/s\tjobs/s\twork s\tstart ms\tstop ms\txacts/job\tWAL B/job\tclient CPU µs/job\tmachine CPU µs/job\t")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f\t%.2f\t%.0f\t%.0f\t%.3f\t%.0f\t%.0f\t%.0f\t\n",
			res.System, res.Setting, res.Round, res.InsertRowsPerSec, res.JobsPerSec, res.WorkSeconds,
			res.StartMillis, res.StopMillis, res.XactsPerJob, res.WALBytesPerJob,
			res.ClientCPUMicrosPerJob, res.MachineCPUMicrosPerJob)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "medians over rounds:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tsetting\trounds\tinsert rows/s\tjobs/s\txacts/job\tWAL B/job\tclient CPU µs/job\tmachine CPU µs/job\t")
	for _, m := range r.Medians {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f\t%.3f\t%.0f\t%.0f\t%.0f\t\n",
			m.System, m.Setting, m.Rounds, m.InsertRowsPerSec, m.JobsPerSec, m.XactsPerJob, m.WALBytesPerJob,
			m.ClientCPUMicros, m.MachineCPUMicros)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "ratio gendurable/river insert_rows_per_sec: %s\n", fmtRatio(r.RatioInsert))
	fmt.Fprintf(w, "ratio gendurable/river jobs_per_sec@equal: %s\n", fmtRatio(r.RatioJobsEqual))
	_, err := fmt.Fprintf(w, "ratio gendurable/river jobs_per_sec: %s\n", fmtRatio(r.RatioJobsBest))
	return err
}

// WriteJSON writes the report as one JSON object (NaN ratios as null).
func (r *Report) WriteJSON(w io.Writer) error {
	type alias Report
	out := struct {
		*alias
		RatioInsert    *float64 `json:"ratio_insert_rows_per_sec"`
		RatioJobsBest  *float64 `json:"ratio_jobs_per_sec"`
		RatioJobsEqual *float64 `json:"ratio_jobs_per_sec_equal"`
	}{alias: (*alias)(r), RatioInsert: finite(r.RatioInsert), RatioJobsBest: finite(r.RatioJobsBest), RatioJobsEqual: finite(r.RatioJobsEqual)}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func finite(x float64) *float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return nil
	}
	return &x
}
