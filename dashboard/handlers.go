package dashboard

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gendurable/gendurable"
)

// maxFilterLen bounds a filter value (the engine's keys are at most 1000 bytes).
const maxFilterLen = 1000

// ---------------------------------------------------------------------------
// Queues overview

type queuesData struct {
	Queues   []queueRow
	Totals   map[gendurable.Status]int64
	Total    int64
	Refresh  int
	Machines int
}

type queueRow struct {
	gendurable.QueueStats
	Rate rate
}

func (d *dashboard) queuesPage(w http.ResponseWriter, r *http.Request) {
	stats, err := d.eng.Queues(r.Context())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	// Queues this engine works but that hold nothing yet.
	have := map[string]bool{}
	for _, q := range stats {
		have[q.Queue] = true
	}
	for name := range d.eng.Config().Queues {
		if !have[name] {
			stats = append(stats, gendurable.QueueStats{Queue: name, ByStatus: map[gendurable.Status]int64{}})
		}
	}
	sort.Slice(stats, func(i, j int) bool { return stats[i].Queue < stats[j].Queue })
	rates := d.sampler.observe(time.Now(), stats)

	data := queuesData{Totals: map[gendurable.Status]int64{}, Machines: len(d.eng.Machines())}
	for _, q := range stats {
		data.Queues = append(data.Queues, queueRow{QueueStats: q, Rate: rates[q.Queue]})
		for s, n := range q.ByStatus {
			data.Totals[s] += n
		}
		data.Total += q.Total
	}
	if v := r.URL.Query().Get("refresh"); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			data.Refresh = min(max(n, 2), 300)
		}
	}
	d.render(w, r, http.StatusOK, "queues", "Queues", "queues", data)
}

func (d *dashboard) pauseAction(w http.ResponseWriter, r *http.Request) {
	q := r.PathValue("queue")
	note(r, "queue", q)
	if err := d.eng.Pause(r.Context(), q); err != nil {
		d.fail(w, r, err)
		return
	}
	d.redirect(w, r, "/", "paused")
}

func (d *dashboard) resumeAction(w http.ResponseWriter, r *http.Request) {
	q := r.PathValue("queue")
	note(r, "queue", q)
	if err := d.eng.Resume(r.Context(), q); err != nil {
		d.fail(w, r, err)
		return
	}
	d.redirect(w, r, "/", "resumed")
}

// ---------------------------------------------------------------------------
// Instance list

// listForm is the list's filters as the user typed them (to refill the form).
type listForm struct {
	Queue, Status, Machine, Step, From, To, Q string
	Limit                                     int
}

type listData struct {
	Form     listForm
	Rows     []gendurable.InstanceSummary
	Paged    bool   // this is not the first page
	NextURL  string // "" on the last page
	FirstURL string
	Machines []string
	Queues   []string
	Max      int
	Scanned  int  // instances the page looked at
	Partial  bool // it stopped at its scan bound before filling up
}

// timeLayouts accepted by the from/to filters (UTC unless they say).
var timeLayouts = []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"}

func parseTime(field, s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, inputError(fmt.Sprintf("%q is not a time: use YYYY-MM-DDTHH:MM (UTC) or RFC 3339.", field))
}

// parseList reads the list filters from the query string.
func (d *dashboard) parseList(q url.Values) (gendurable.ListFilter, listForm, error) {
	var f gendurable.ListFilter
	form := listForm{
		Queue: strings.TrimSpace(q.Get("queue")), Status: strings.TrimSpace(q.Get("status")),
		Machine: strings.TrimSpace(q.Get("machine")), Step: strings.TrimSpace(q.Get("step")),
		From: strings.TrimSpace(q.Get("from")), To: strings.TrimSpace(q.Get("to")), Q: strings.TrimSpace(q.Get("q")),
		Limit: d.opts.PageSize,
	}
	for _, v := range []string{form.Queue, form.Machine, form.Step, form.Q} {
		if len(v) > maxFilterLen {
			return f, form, inputError(fmt.Sprintf("A filter is longer than %d bytes.", maxFilterLen))
		}
	}
	f.Queue, f.Machine, f.Step, f.Search = form.Queue, form.Machine, form.Step, form.Q
	if form.Status != "" {
		if !slices.Contains(allStatuses, gendurable.Status(form.Status)) {
			return f, form, inputError("Unknown status.")
		}
		f.Status = gendurable.Status(form.Status)
	}
	var err error
	if form.From != "" {
		if f.From, err = parseTime("from", form.From); err != nil {
			return f, form, err
		}
	}
	if form.To != "" {
		if f.To, err = parseTime("to", form.To); err != nil {
			return f, form, err
		}
	}
	if v := q.Get("before"); v != "" {
		if f.Before, err = strconv.ParseInt(v, 10, 64); err != nil || f.Before < 0 {
			return f, form, inputError("Bad page cursor.")
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return f, form, inputError("The page size must be a positive number.")
		}
		form.Limit = min(n, MaxPageSize) // bounded, whatever was asked
	}
	f.Limit = form.Limit
	return f, form, nil
}

func (d *dashboard) listPage(w http.ResponseWriter, r *http.Request) {
	f, form, err := d.parseList(r.URL.Query())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	page, err := d.eng.List(r.Context(), f)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	if len(page.Instances) > form.Limit { // belt and braces: never more than asked
		page.Instances = page.Instances[:form.Limit]
	}
	data := listData{Form: form, Rows: page.Instances, Paged: f.Before > 0, Max: MaxPageSize,
		Scanned: page.Scanned, Partial: page.Partial}
	kv := []string{"queue", form.Queue, "status", form.Status, "machine", form.Machine, "step", form.Step,
		"from", form.From, "to", form.To, "q", form.Q}
	if form.Limit != d.opts.PageSize {
		kv = append(kv, "limit", strconv.Itoa(form.Limit))
	}
	data.FirstURL = d.listURL(kv...)
	if page.NextBefore > 0 {
		data.NextURL = d.listURL(append(kv, "before", strconv.FormatInt(page.NextBefore, 10))...)
	}
	for name := range d.eng.Machines() {
		data.Machines = append(data.Machines, name)
	}
	sort.Strings(data.Machines)
	for name := range d.eng.Config().Queues {
		data.Queues = append(data.Queues, name)
	}
	sort.Strings(data.Queues)
	d.render(w, r, http.StatusOK, "instances", "Instances", "instances", data)
}

// ---------------------------------------------------------------------------
// Instance detail and actions

type instanceData struct {
	*gendurable.InstanceDetail
	StateJSON  string
	ResultJSON string
	Errors     []gendurable.StepError // newest first
	Signals    []signalRow
	Children   []childRow
	Pending    int // unconsumed signals
	AwaitNames []string
	CanRetry   bool
	CanCancel  bool
	CanSignal  bool
}

type signalRow struct {
	gendurable.SignalInfo
	PayloadJSON string
}

type childRow struct {
	gendurable.Child
	ResultJSON string
}

func parseID(r *http.Request) (int64, bool) {
	v := r.PathValue("id")
	if !isDigits(v) {
		return 0, false
	}
	id, err := strconv.ParseInt(v, 10, 64)
	return id, err == nil && id > 0
}

func (d *dashboard) instancePage(w http.ResponseWriter, r *http.Request) {
	id, ok := parseID(r)
	if !ok {
		d.fail(w, r, gendurable.ErrNotFound)
		return
	}
	det, err := d.eng.Describe(r.Context(), id)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	data := instanceData{
		InstanceDetail: det,
		StateJSON:      d.prettyJSON(det.Machine, det.State),
		ResultJSON:     d.prettyJSON(det.Machine, det.Result),
		CanRetry:       det.Status == gendurable.StatusFailed,
		CanCancel:      !det.Status.Terminal(),
		CanSignal:      !det.Status.Terminal(),
	}
	for i := len(det.Errors) - 1; i >= 0; i-- {
		data.Errors = append(data.Errors, det.Errors[i])
	}
	for _, s := range det.Signals {
		data.Signals = append(data.Signals, signalRow{SignalInfo: s, PayloadJSON: d.prettyJSON(det.Machine, s.Payload)})
		if s.ConsumedAt == nil {
			data.Pending++
		}
	}
	for _, c := range det.Children {
		data.Children = append(data.Children, childRow{Child: c, ResultJSON: d.prettyJSON(c.Machine, c.Result)})
	}
	if det.Wait != nil {
		data.AwaitNames = det.Wait.Signals
	}
	d.render(w, r, http.StatusOK, "instance", fmt.Sprintf("Instance %d", det.ID), "instances", data)
}

func (d *dashboard) retryAction(w http.ResponseWriter, r *http.Request) {
	id, ok := parseID(r)
	if !ok {
		d.fail(w, r, gendurable.ErrNotFound)
		return
	}
	note(r, "id", id)
	if err := d.eng.Retry(r.Context(), id); err != nil {
		d.fail(w, r, err)
		return
	}
	d.redirect(w, r, "/instances/"+strconv.FormatInt(id, 10), "retried")
}

func (d *dashboard) cancelAction(w http.ResponseWriter, r *http.Request) {
	id, ok := parseID(r)
	if !ok {
		d.fail(w, r, gendurable.ErrNotFound)
		return
	}
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	if reason == "" {
		reason = "cancelled from the dashboard"
	}
	note(r, "id", id, "reason", reason)
	if err := d.eng.Cancel(r.Context(), id, reason); err != nil {
		d.fail(w, r, err)
		return
	}
	d.redirect(w, r, "/instances/"+strconv.FormatInt(id, 10), "cancelled")
}

func (d *dashboard) signalAction(w http.ResponseWriter, r *http.Request) {
	id, ok := parseID(r)
	if !ok {
		d.fail(w, r, gendurable.ErrNotFound)
		return
	}
	name := strings.TrimSpace(r.PostForm.Get("name"))
	note(r, "id", id, "name", name)
	payload := strings.TrimSpace(r.PostForm.Get("payload"))
	if payload == "" {
		payload = "null"
	}
	if !json.Valid([]byte(payload)) {
		d.fail(w, r, inputError("The payload is not valid JSON."))
		return
	}
	var opts *gendurable.SignalOpts
	if k := r.PostForm.Get("dedup_key"); k != "" {
		opts = &gendurable.SignalOpts{DedupKey: k}
	}
	res, err := d.eng.Signal(r.Context(), id, name, json.RawMessage(payload), opts)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	note(r, "signal_id", res.ID, "duplicate", res.Duplicate, "woke", res.Woke)
	flash := "signalled"
	switch {
	case res.Duplicate:
		flash = "signal-duplicate"
	case res.Woke:
		flash = "signal-woke"
	}
	d.redirect(w, r, "/instances/"+strconv.FormatInt(id, 10), flash)
}

// ---------------------------------------------------------------------------
// Machines

type machineRow struct {
	Name     string
	Versions []int
}

func (d *dashboard) machinesPage(w http.ResponseWriter, r *http.Request) {
	var rows []machineRow
	for name, vs := range d.eng.Machines() {
		rows = append(rows, machineRow{Name: name, Versions: vs})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Name < rows[j].Name })
	d.render(w, r, http.StatusOK, "machines", "Machines", "machines", rows)
}

type graphData struct {
	*gendurable.MachineGraph
	SVG       *svgGraph
	StepOrder []string // the steps as the drawing orders them
}

func (d *dashboard) graphPage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if name == "" || len(name) > maxFilterLen {
		d.fail(w, r, gendurable.ErrNotFound)
		return
	}
	g, err := d.eng.Graph(r.Context(), name)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	svg := d.layoutGraph(g)
	d.render(w, r, http.StatusOK, "graph", "Machine "+name, "machines", graphData{MachineGraph: g, SVG: svg, StepOrder: svg.stepOrder()})
}
