package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
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
	Queues     []queueRow
	MoreQueues int // queues not shown (maxQueueRows); counted in the totals
	Totals     map[gendurable.Status]int64
	Total      int64
	Machines   int
	Chart      *svgChart
	Throughput *gendurable.Throughput
}

type queueRow struct {
	gendurable.QueueStats
	Rate rate
}

// queueStatsTTL is how long the queues page's counts are shared between
// requests: each read counts every instance (an aggregate over the whole
// table: 130 ms at 200,000 rows on two cores, seconds at millions), and a
// page may refresh itself every 2 s in any number of tabs.
const queueStatsTTL = 2 * time.Second

// maxQueueRows bounds the queues page's rows: the first, by name, and past
// them the ones this engine works and up to as many paused ones. A queue
// per tenant makes tens of thousands (a probe's 50,000 made a page of 47
// MB). The others are counted in the totals; the instance list filters by
// queue.
const maxQueueRows = 500

func (d *dashboard) queuesPage(w http.ResponseWriter, r *http.Request) {
	cached, err := d.queueStats.get(r.Context(), queueStatsTTL, d.eng.Queues)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	stats := slices.Clone(cached) // shared with other requests: appended to below
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
	tp, err := d.throughput(r.Context())
	if err != nil {
		d.fail(w, r, err)
		return
	}

	machines, err := d.machineNames(r.Context())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	data := queuesData{Totals: map[gendurable.Status]int64{}, Machines: len(machines),
		Chart: layoutChart(tp.Buckets), Throughput: tp}
	configured := d.eng.Config().Queues
	past := 0 // rows shown past the bound
	for i, q := range stats {
		for s, n := range q.ByStatus { // every queue, shown or not
			data.Totals[s] += n
		}
		data.Total += q.Total
		// Past the bound, a queue this engine works is still shown, and so
		// are paused ones, up to the bound again: their pause state and
		// their forms are only here.
		_, works := configured[q.Queue]
		switch {
		case i < maxQueueRows:
		case works || q.Paused && past < maxQueueRows:
			past++
		default:
			data.MoreQueues++
			continue
		}
		data.Queues = append(data.Queues, queueRow{QueueStats: q, Rate: rateOf(tp.ByQueue[q.Queue])})
	}
	d.render(w, r, http.StatusOK, "queues", "Queues", "queues", data)
}

// machineNamesTTL is how long the names of the machines the dashboard
// knows are shared between requests: the queues, list and graph pages all
// need them, and each read lists every stored definition.
const machineNamesTTL = 2 * time.Second

// machineNames are the names of the machines the dashboard knows, sorted:
// those every engine stored when it started and those registered in its
// own engine ([gendurable.Engine.ListMachines]), so that a standalone
// `gendurable ui` knows them all. If the stored ones cannot be read — a
// schema migrated before version 7 has no table for them — it falls back
// to the registered ones, with a warning in the log, rather than fail the
// page; only a request out of time fails. They are shared between requests
// for machineNamesTTL (see shared): the slice is read-only.
func (d *dashboard) machineNames(ctx context.Context) ([]string, error) {
	return d.machines.get(ctx, machineNamesTTL, d.readMachineNames)
}

// readMachineNames reads what machineNames shares.
func (d *dashboard) readMachineNames(ctx context.Context) ([]string, error) {
	ms, err := d.eng.ListMachines(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		d.log.Warn("dashboard: reading the stored machines failed; showing the machines registered here", "err", err)
		var names []string
		for name := range d.eng.Machines() {
			names = append(names, name)
		}
		sort.Strings(names)
		return names, nil
	}
	var names []string
	for _, m := range ms { // by name, then version
		if len(names) == 0 || names[len(names)-1] != m.Name {
			names = append(names, m.Name)
		}
	}
	return names, nil
}

// queueOf is the queue a pause or resume names: in the path, or, for a
// name a path cannot carry ("." and "..", "/"), in the query (queueURL).
func queueOf(r *http.Request) string {
	if q := r.PathValue("queue"); q != "" {
		return q
	}
	return r.URL.Query().Get("queue")
}

// noQueue answers a pause or resume that names no queue: a form field
// "queue" in the body is not where the name goes (a probe got the generic
// "Invalid input" page for it).
func (d *dashboard) noQueue(w http.ResponseWriter, r *http.Request) {
	d.errorPage(w, r, http.StatusBadRequest, "No queue named: a pause or resume names its queue in the URL (/queues/pause?queue=NAME or /queues/NAME/pause), not in the form.")
}

func (d *dashboard) pauseAction(w http.ResponseWriter, r *http.Request) {
	q := queueOf(r)
	note(r, "queue", q)
	if q == "" {
		d.noQueue(w, r)
		return
	}
	if err := d.eng.Pause(r.Context(), q); err != nil {
		d.fail(w, r, err)
		return
	}
	d.redirect(w, r, "/", "paused")
}

func (d *dashboard) resumeAction(w http.ResponseWriter, r *http.Request) {
	q := queueOf(r)
	note(r, "queue", q)
	if q == "" {
		d.noQueue(w, r)
		return
	}
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
	Queue, Status, Machine, Step, From, To, Q, State string
	Limit                                            int
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
	// The bulk form: the filters again (hidden fields), whether there are
	// any (the "all matching" buttons need some), and them as text.
	Hidden     []hiddenField
	Filtered   bool
	FilterText string
}

type hiddenField struct{ Name, Value string }

// timeLayouts accepted by the from/to filters (UTC unless they say).
var timeLayouts = []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"}

func parseTime(field, s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			if t.IsZero() {
				// The zero time is what the engine reads as "no bound": a
				// bulk action would act on every match instead of none.
				return t, inputError(fmt.Sprintf("%q: 0001-01-01T00:00Z is not a bound the list can use; leave the field empty for none.", field))
			}
			return t, nil
		}
	}
	return time.Time{}, inputError(fmt.Sprintf("%q is not a time: use YYYY-MM-DDTHH:MM (UTC) or RFC 3339.", field))
}

// listFields are the fields parseList reads.
var listFields = []string{"queue", "status", "machine", "step", "from", "to", "q", "state", "before", "limit"}

// parseList reads the list filters from the query string.
func (d *dashboard) parseList(q url.Values) (gendurable.ListFilter, listForm, error) {
	var f gendurable.ListFilter
	for _, k := range listFields {
		if len(q[k]) > 1 {
			// Only the first would be read: a list narrower or wider than
			// asked. The CLI refuses a filter flag given twice too.
			return f, listForm{Limit: d.opts.PageSize}, inputError(fmt.Sprintf("The filter %q is given more than once: give each filter once.", k))
		}
	}
	// Names and the search text are taken as sent (white space around a
	// name is the engine's ErrInvalidInput: a 400), so a bulk action acts
	// on the filter its audit line records, as the CLI and the API do; a
	// status, a time and a JSON document mean the same with it trimmed.
	form := listForm{
		Queue: q.Get("queue"), Status: strings.TrimSpace(q.Get("status")),
		Machine: q.Get("machine"), Step: q.Get("step"),
		From: strings.TrimSpace(q.Get("from")), To: strings.TrimSpace(q.Get("to")), Q: q.Get("q"),
		State: strings.TrimSpace(q.Get("state")), Limit: d.opts.PageSize,
	}
	for _, v := range []string{form.Queue, form.Machine, form.Step, form.Q} {
		if len(v) > maxFilterLen {
			return f, form, inputError(fmt.Sprintf("A filter is longer than %d bytes.", maxFilterLen))
		}
	}
	if form.Q != strings.TrimSpace(form.Q) {
		return f, form, inputError("The search text starts or ends with white space (no id or key does).")
	}
	f.Queue, f.Machine, f.Step, f.Search = form.Queue, form.Machine, form.Step, form.Q
	if form.State != "" {
		if len(form.State) > gendurable.MaxStateFilter || !json.Valid([]byte(form.State)) ||
			(form.State[0] != '{' && form.State[0] != '[') {
			return f, form, inputError(fmt.Sprintf(`"State contains" must be a JSON object or array of at most %d bytes, e.g. {"customer": "c-7"}.`, gendurable.MaxStateFilter))
		}
		f.State = json.RawMessage(form.State)
	}
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
		if f.Before == 0 {
			// Read as no cursor, it showed the newest page again: a script
			// paging with an unset variable would loop on it. The CLI
			// refuses --before 0 for the same reason; the pager never
			// links to it.
			return f, form, inputError("The page cursor \"before\" must be an id above 0 (the \"Older\" link's); leave it out for the newest page.")
		}
	}
	if v := q.Get("limit"); v != "" {
		// Refused out of range, as the CLI refuses --limit (1..500, the
		// same bound): before, a page silently showed at most 100 rows
		// for ?limit=500, which `gendurable list --limit 500` shows whole
		// (a hostile probe).
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			return f, form, inputError(fmt.Sprintf("The page size (limit) must be a whole number from 1 to %d.", MaxPageSize))
		}
		form.Limit = n
	}
	f.Limit = form.Limit
	return f, form, nil
}

func (d *dashboard) listPage(w http.ResponseWriter, r *http.Request) {
	f, form, err := d.parseList(r.URL.Query())
	var machines []string // the form lists them; a state filter's check reads the same, shared copy
	if err == nil {
		machines, err = d.machineNames(r.Context())
	}
	if err == nil {
		err = d.checkStateFilter(r.Context(), f)
	}
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
		"from", form.From, "to", form.To, "q", form.Q, "state", form.State}
	if form.Limit != d.opts.PageSize {
		kv = append(kv, "limit", strconv.Itoa(form.Limit))
	}
	data.FirstURL = d.listURL(kv...)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] != "limit" && kv[i+1] != "" {
			data.Hidden = append(data.Hidden, hiddenField{kv[i], kv[i+1]})
			data.FilterText += " " + kv[i] + "=" + kv[i+1]
		}
	}
	data.Filtered, data.FilterText = len(data.Hidden) > 0, strings.TrimSpace(data.FilterText)
	if page.NextBefore > 0 {
		data.NextURL = d.listURL(append(kv, "before", strconv.FormatInt(page.NextBefore, 10))...)
	}
	data.Machines = machines
	for name := range d.eng.Config().Queues {
		data.Queues = append(data.Queues, name)
	}
	sort.Strings(data.Queues)
	d.render(w, r, http.StatusOK, "instances", "Instances", "instances", data)
}

// checkStateFilter refuses a "State contains" filter that names data
// Options.Redact hides: whether an instance is listed (or counted by a bulk
// action) would tell whether its hidden value is the one guessed, one
// request per guess — with an id search, of one instance's PIN or token.
// A filter names hidden data when Redact, given the filter as a document
// of the filter's machine, changes it. Without a machine the filter is
// refused: the machines the dashboard knows (those some engine started
// with) are not all that have instances — a producer that only inserts
// records none — and a machine Redact was never asked about would be an
// oracle again.
func (d *dashboard) checkStateFilter(_ context.Context, f gendurable.ListFilter) error {
	if d.opts.Redact == nil || len(f.State) == 0 {
		return nil
	}
	if f.Machine == "" {
		return inputError("\"State contains\" needs a machine on this dashboard (it hides data with Options.Redact, which is asked per machine): choose one.")
	}
	names := []string{f.Machine}
	var want any
	if err := json.Unmarshal(f.State, &want); err != nil {
		return inputError("\"State contains\" is not valid JSON.")
	}
	for _, m := range names {
		var got any
		red := d.opts.Redact(m, slices.Clone(f.State))
		if json.Unmarshal(red, &got) != nil || !reflect.DeepEqual(got, want) {
			return inputError("\"State contains\" names data this dashboard hides (Options.Redact): searching for it would reveal it. Filter on other fields.")
		}
	}
	return nil
}

// ---------------------------------------------------------------------------
// Instance detail and actions

type instanceData struct {
	*gendurable.InstanceDetail
	StateJSON  string
	ResultJSON string
	Errors     []errorRow // newest first
	Timeline   *svgTimeline
	Events     []timelineEvent
	Signals    []signalRow
	Children   []childRow
	Pending    int // unconsumed signals
	AwaitNames []string
	CanRetry   bool
	CanCancel  bool
	CanSignal  bool
	// CanCancelTree: it has children (Engine.CancelTree). Offered whatever
	// the statuses shown: a finished parent can have live descendants below
	// a child cancelled alone (Cancel leaves its children running, and the
	// parent counts the cancelled child finished), and the page lists only
	// the children, not theirs.
	CanCancelTree bool
	// CanRunNow: runnable, but not before a later time (scheduled, or
	// backing off before its next attempt), by this process's clock; the
	// engine decides on the database's (Engine.RunNow).
	CanRunNow bool
}

type errorRow struct {
	gendurable.StepError
	StackID string // the id of its collapsed stack trace, stable across refreshes
}

// pageValueBytes bounds each signal payload and child result an instance's
// page shows (as JSON text); longer ones are left out, their length shown.
const pageValueBytes = 4096

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
	// Bounded in bytes as in rows: 100 signals and 500 children whose
	// payloads and results were whole made pages of hundreds of megabytes.
	det, err := d.eng.DescribeWith(r.Context(), id, gendurable.DescribeOptions{ValueBytes: pageValueBytes})
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
		CanCancelTree:  len(det.Children) > 0,
		CanRunNow: det.Status == gendurable.StatusRunnable && det.EligibleAt.After(time.Now()) &&
			(det.Wait == nil || det.Wait.LeaseExpiresAt == nil), // not one waiting for its cancelled step's lease
	}
	for i := len(det.Errors) - 1; i >= 0; i-- {
		e := det.Errors[i]
		data.Errors = append(data.Errors, errorRow{StepError: e, StackID: "stack-" + strconv.FormatInt(e.At.UnixNano(), 36) + "-" + strconv.Itoa(e.Attempt)})
	}
	data.Timeline, data.Events = buildTimeline(det, time.Now())
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
	flash := "retried"
	if wr, err := d.eng.WaitReason(r.Context(), id); err == nil {
		switch {
		case wr.Status == gendurable.StatusRunnable && wr.LeaseExpiresAt != nil:
			flash = "retried-lease"
		case wr.Status == gendurable.StatusAwaitingChildren:
			flash = "retried-children"
		case wr.Status == gendurable.StatusAwaitingSignal:
			flash = "retried-await"
		case wr.Status == gendurable.StatusRunnable && wr.Delayed:
			// Cancelled while it waited (a delay, a sleep, a backoff): the
			// retry keeps the wait, and "runnable again" read as "runs now".
			// Delayed is read on the database's clock, as the CLI reads it:
			// this process's clock a few ms behind made every retry "keep a
			// wait" (a review).
			flash = "retried-wait"
		}
	}
	d.redirect(w, r, "/instances/"+strconv.FormatInt(id, 10), flash)
}

// runNowAction makes a scheduled or backing-off instance eligible now
// (Engine.RunNow): its attempt count is kept. One that is already eligible
// is left as it is.
func (d *dashboard) runNowAction(w http.ResponseWriter, r *http.Request) {
	id, ok := parseID(r)
	if !ok {
		d.fail(w, r, gendurable.ErrNotFound)
		return
	}
	note(r, "id", id)
	if err := d.eng.RunNow(r.Context(), id); err != nil {
		d.fail(w, r, err)
		return
	}
	flash := "ran-now"
	if wr, err := d.eng.WaitReason(r.Context(), id); err == nil && wr.Status == gendurable.StatusRunnable && wr.LeaseExpiresAt != nil {
		flash = "ran-now-lease" // retried while its cancelled step's lease lives: eligible when it ends
	}
	d.redirect(w, r, "/instances/"+strconv.FormatInt(id, 10), flash)
}

// cancelForm is a cancel's instance id and reason, noted on the audit
// line; ok false when the request was failed (written already).
func (d *dashboard) cancelForm(w http.ResponseWriter, r *http.Request) (id int64, reason string, ok bool) {
	id, ok = parseID(r)
	if !ok {
		d.fail(w, r, gendurable.ErrNotFound)
		return 0, "", false
	}
	note(r, "id", id)
	reason, err := cancelReason(r)
	if err != nil {
		// Refused: the line says which instance, and how long a reason was
		// sent (not the text itself, which may be what was wrong with it).
		note(r, "reason_bytes", len(r.PostForm.Get("reason")))
		d.fail(w, r, err)
		return 0, "", false
	}
	note(r, "reason", reason)
	return id, reason, true
}

func (d *dashboard) cancelAction(w http.ResponseWriter, r *http.Request) {
	id, reason, ok := d.cancelForm(w, r)
	if !ok {
		return
	}
	if err := d.eng.Cancel(r.Context(), id, reason); err != nil {
		d.fail(w, r, err)
		return
	}
	d.redirect(w, r, "/instances/"+strconv.FormatInt(id, 10), "cancelled")
}

// cancelTreeAction cancels an instance and every live descendant, parents
// first (Engine.CancelTree), and returns to the instance with the counts. It
// stops at the request's timeout after the statement under way, as a bulk
// cancel by filter does: what was done stays done and is counted.
func (d *dashboard) cancelTreeAction(w http.ResponseWriter, r *http.Request) {
	id, reason, ok := d.cancelForm(w, r)
	if !ok {
		return
	}
	res, err := d.eng.CancelTree(r.Context(), id, reason)
	partial, failed := d.bulkDone(w, r, res, err)
	if failed {
		return
	}
	v := url.Values{"flash": {"tree-cancelled"}, "changed": {strconv.FormatInt(res.Changed, 10)},
		"skipped": {strconv.FormatInt(res.Skipped, 10)}}
	if partial {
		v.Set("partial", "1")
	}
	path := "/instances/" + strconv.FormatInt(id, 10)
	http.Redirect(w, r, d.link(path)+"?"+d.signFlash(path, v).Encode(), http.StatusSeeOther)
}

func (d *dashboard) signalAction(w http.ResponseWriter, r *http.Request) {
	id, ok := parseID(r)
	if !ok {
		d.fail(w, r, gendurable.ErrNotFound)
		return
	}
	// As typed, as the CLI and the API take it: a name with white space
	// around it is refused (ErrInvalidSignal), not changed into another.
	name := r.PostForm.Get("name")
	note(r, "id", id, "name", cut(name), "payload_bytes", len(r.PostForm.Get("payload")))
	if k := r.PostForm.Get("dedup_key"); k != "" {
		note(r, "dedup_key", cut(k))
	}
	payload := strings.TrimSpace(r.PostForm.Get("payload"))
	if payload == "" {
		payload = "null"
	}
	if !json.Valid([]byte(payload)) {
		d.fail(w, r, inputError("The payload is not valid JSON, or nests arrays and objects far deeper than the engine takes (Config.MaxJSONDepth, 1,000 levels by default)."))
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
	// On the engine's Logger too, as the CLI's signal logs it and as the
	// engine logs the dashboard's other actions (a retry, a cancel): Signal
	// is the application's call as well, so the engine does not log it
	// itself (an operator probe found the dashboard's signal missing there).
	msg := "gendurable: signal sent"
	if res.Duplicate {
		msg = "gendurable: signal not sent (a duplicate)"
	}
	d.eng.Config().Logger.Info(msg, "id", id, "name", name, "signal_id", res.ID, "duplicate", res.Duplicate, "woke", res.Woke)
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
	Name       string
	Versions   []int
	Steps      int  // of the newest version
	Flow       bool // the newest version declares its transitions
	Registered bool // in this dashboard's engine
	Stored     bool
	SeenAt     *time.Time // last start of an engine registering it
}

func (d *dashboard) machinesPage(w http.ResponseWriter, r *http.Request) {
	if q := r.URL.Query(); q.Has("name") { // the graph of "." or "..", "/" (machineURL)
		if len(q["name"]) > 1 {
			// Only the first would be drawn (a hostile probe): as the list
			// refuses a filter given twice.
			d.fail(w, r, inputError("The field \"name\" is given more than once: give it once."))
			return
		}
		d.graph(w, r, q.Get("name"))
		return
	}
	ms, err := d.eng.ListMachines(r.Context())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	var rows []machineRow
	for _, m := range ms { // by name, then version
		if len(rows) == 0 || rows[len(rows)-1].Name != m.Name {
			rows = append(rows, machineRow{Name: m.Name})
		}
		row := &rows[len(rows)-1]
		row.Versions = append(row.Versions, m.Version)
		row.Steps, row.Flow = len(m.Steps), m.Flow
		row.Registered = row.Registered || m.Registered
		row.Stored = row.Stored || m.Stored
		if m.SeenAt != nil && (row.SeenAt == nil || m.SeenAt.After(*row.SeenAt)) {
			row.SeenAt = m.SeenAt
		}
	}
	d.render(w, r, http.StatusOK, "machines", "Machines", "machines", rows)
}

type graphData struct {
	*gendurable.MachineGraph
	SVG       *svgGraph
	StepOrder []string // the steps as the drawing orders them
}

func (d *dashboard) graphPage(w http.ResponseWriter, r *http.Request) {
	d.graph(w, r, r.PathValue("name"))
}

// graphTTL is how long a machine's graph is shared between requests: its
// counts are an aggregate over the machine's instances (a sequential scan
// of the table: 129 ms at 200,000 rows on two cores).
const graphTTL = 2 * time.Second

func (d *dashboard) graph(w http.ResponseWriter, r *http.Request, name string) {
	if name == "" {
		d.fail(w, r, gendurable.ErrNotFound)
		return
	}
	if len(name) > maxFilterLen {
		// Invalid, as the engine finds a name over 200 bytes (400): an
		// operator probe saw 404, then 400 from 201 bytes to 1,000, then
		// 404 again. A valid name no machine has is 404.
		d.fail(w, r, inputError("A machine name is at most 200 bytes."))
		return
	}
	// The graphs of the machines the dashboard knows (stored by an engine,
	// or registered in its own) are shared; another name (a machine known
	// only by its instances, or none) is read for its request alone, so
	// that names a client makes up cannot fill memory.
	names, err := d.machineNames(r.Context())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	var g *gendurable.MachineGraph
	if slices.Contains(names, name) {
		g, err = d.graphOf(name).get(r.Context(), graphTTL, func(ctx context.Context) (*gendurable.MachineGraph, error) {
			return d.eng.Graph(ctx, name)
		})
	} else {
		g, err = d.eng.Graph(r.Context(), name)
	}
	if err != nil {
		d.fail(w, r, err)
		return
	}
	svg := d.layoutGraph(g)
	d.render(w, r, http.StatusOK, "graph", "Machine "+name, "machines", graphData{MachineGraph: g, SVG: svg, StepOrder: svg.stepOrder()})
}
