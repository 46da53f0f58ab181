package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gendurable/gendurable"
)

// Bulk retry and cancel (the instance list). Two ways to pick instances:
//
//   - ticked rows: the form's "id" values, at most MaxPageSize (one page);
//   - the list's filter (scope=match): every instance the filter matches,
//     not only the page shown, walked by Engine.RetryMatching /
//     CancelMatching in bounded batches. A filter without criteria is
//     refused, and so is one whose only criterion is a time range that
//     leaves out no instance (the engine's check): the dashboard never acts
//     on every instance at once.
//
// A retry changes failed instances only and a cancel live ones; the others
// are counted as skipped. The work stops at the request's timeout
// (Options.RequestTimeout), after the batch under way: what was done by
// then stays done and is counted, and the page says the run was cut short. Like every mutation, both are POST only,
// cross-origin protected, refused in read-only mode and audit-logged (with
// the ids or the filter, and the counts).

// bulkForm is what a bulk action was asked to do.
type bulkForm struct {
	ids    []int64
	filter gendurable.ListFilter
	match  bool
	back   string // the list page to return to, with its filters
}

// parseBulk reads and validates a bulk form.
func (d *dashboard) parseBulk(r *http.Request) (bulkForm, error) {
	var b bulkForm
	// The list's page fields bound a page, not a match: a bulk action
	// that read them as a filter would act beyond them, and one that
	// ignored them on more than was sent. The dashboard's forms never send
	// them.
	for _, k := range []string{"before", "limit"} {
		if _, ok := r.PostForm[k]; ok {
			return b, inputError(fmt.Sprintf("%q bounds a page of the list, not a bulk action: filter the list, or tick rows.", k))
		}
	}
	f, form, err := d.parseList(r.PostForm)
	if err != nil {
		return b, err
	}
	b.filter = gendurable.ListFilter{Queue: f.Queue, Status: f.Status, Machine: f.Machine, Step: f.Step,
		From: f.From, To: f.To, Search: f.Search, State: f.State}
	b.back = listPath(form)
	switch scope := r.PostForm.Get("scope"); scope {
	case "match":
		if !b.filter.HasCriteria() {
			return b, inputError("Filter the list first: acting on every instance at once is not offered here.")
		}
		if len(r.PostForm["id"]) > 0 {
			return b, inputError("Either tick rows or act on the whole filter, not both.")
		}
		b.match = true
	case "", "selected":
		vs := r.PostForm["id"]
		switch {
		case len(vs) == 0:
			return b, inputError("Tick at least one instance.")
		case len(vs) > MaxPageSize:
			return b, inputError(fmt.Sprintf("At most %d instances at once; act on the filter for more.", MaxPageSize))
		}
		for _, v := range vs {
			id, err := strconv.ParseInt(v, 10, 64)
			if !isDigits(v) || err != nil || id <= 0 {
				return b, inputError("Bad instance id.")
			}
			b.ids = append(b.ids, id)
		}
	default:
		return b, inputError("Unknown scope.")
	}
	return b, nil
}

// listPath is the list page with form's filters, relative to the base.
func listPath(form listForm) string {
	v := url.Values{}
	for _, kv := range [][2]string{{"queue", form.Queue}, {"status", form.Status}, {"machine", form.Machine},
		{"step", form.Step}, {"from", form.From}, {"to", form.To}, {"q", form.Q}, {"state", form.State}} {
		if kv[1] != "" {
			v.Set(kv[0], kv[1])
		}
	}
	if len(v) == 0 {
		return "/instances"
	}
	return "/instances?" + v.Encode()
}

func (d *dashboard) bulkRetryAction(w http.ResponseWriter, r *http.Request) {
	d.bulk(w, r, "retried", func(ctx context.Context, b bulkForm) (gendurable.BulkResult, error) {
		if b.match {
			return d.eng.RetryMatching(ctx, b.filter)
		}
		return d.eng.RetryMany(ctx, b.ids)
	})
}

// cancelReason is a cancel form's reason: trimmed, a default when empty,
// refused over gendurable.MaxReasonBytes, the library's and the CLI's
// bound too (a reason of 1,001 to 4,000 bytes was refused here alone).
func cancelReason(r *http.Request) (string, error) {
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	if reason == "" {
		reason = "cancelled from the dashboard"
	}
	if len(reason) > gendurable.MaxReasonBytes {
		return "", inputError(fmt.Sprintf("The reason is longer than %d bytes.", gendurable.MaxReasonBytes))
	}
	if strings.ContainsRune(reason, 0) || !utf8.ValidString(reason) {
		// The error history stores text: it would be stored without them,
		// not as the audit line says.
		return "", inputError("The reason holds a NUL byte or invalid UTF-8.")
	}
	return reason, nil
}

// bulkDone reports a bulk call's result to the request's audit line and
// says whether it failed the request (written already): an error fails it,
// unless the request's timeout cut the call short after some work (partial:
// what was done is reported).
func (d *dashboard) bulkDone(w http.ResponseWriter, r *http.Request, res gendurable.BulkResult, err error) (partial, failed bool) {
	note(r, "matched", res.Matched, "changed", res.Changed, "skipped", res.Skipped, "not_found", res.NotFound,
		"changed_ids", res.ChangedIDs)
	if res.Truncated {
		// changed_ids holds the first gendurable.MaxBulkIDs only: say so,
		// or the line reads as the whole list.
		note(r, "changed_ids_truncated", true)
	}
	if err == nil {
		return false, false
	}
	if !errors.Is(err, context.DeadlineExceeded) || res.Matched == 0 {
		if res.Changed > 0 {
			// Cut short otherwise (the client hung up: context.Canceled)
			// after changing some: the audit line says they changed.
			note(r, "partial", true)
		}
		d.fail(w, r, err)
		return false, true
	}
	note(r, "partial", true)
	return true, false
}

func (d *dashboard) bulkCancelAction(w http.ResponseWriter, r *http.Request) {
	reason, err := cancelReason(r)
	if err != nil {
		noteSent(r)
		d.fail(w, r, err)
		return
	}
	d.bulk(w, r, "cancelled", func(ctx context.Context, b bulkForm) (gendurable.BulkResult, error) {
		note(r, "reason", reason)
		if b.match {
			return d.eng.CancelMatching(ctx, b.filter, reason)
		}
		return d.eng.CancelMany(ctx, b.ids, reason)
	})
}

// bulk runs one bulk action and redirects to the list with its counts.
func (d *dashboard) bulk(w http.ResponseWriter, r *http.Request, done string,
	run func(context.Context, bulkForm) (gendurable.BulkResult, error)) {
	b, err := d.parseBulk(r)
	if err == nil {
		err = d.checkStateFilter(r.Context(), b.filter)
	}
	if err != nil {
		noteSent(r)
		d.fail(w, r, err)
		return
	}
	if b.match {
		note(r, "scope", "match", "filter", b.filter.String())
	} else {
		note(r, "scope", "selected", "ids", b.ids)
	}
	res, err := run(r.Context(), b)
	if err != nil && b.match && b.filter.OnlyTimeRange() && errors.Is(err, gendurable.ErrInvalidInput) {
		// The engine's check of a range that takes in every instance (the
		// form's values were checked above): its text is not shown, ours is.
		err = inputError("The filter's only criterion is a time range, and it leaves out no instance: narrow the range, or add another criterion (queue, status, machine, step, search, state).")
	}
	partial, failed := d.bulkDone(w, r, res, err)
	if failed {
		return
	}
	v := url.Values{"flash": {"bulk-" + done}, "changed": {strconv.FormatInt(res.Changed, 10)},
		"skipped": {strconv.FormatInt(res.Skipped, 10)}, "not_found": {strconv.FormatInt(res.NotFound, 10)}}
	if partial {
		v.Set("partial", "1")
	}
	sep := "?"
	if strings.Contains(b.back, "?") {
		sep = "&"
	}
	http.Redirect(w, r, d.link(b.back)+sep+d.signFlash(b.back, v).Encode(), http.StatusSeeOther)
}

// noteSent notes on the audit line of a refused bulk request what it
// asked for, as sent: its scope, its filter fields and its ticked ids (the
// first maxNotedIDs, and how many), each value cut to maxFilterLen bytes.
func noteSent(r *http.Request) {
	f := r.PostForm
	note(r, "scope", f.Get("scope"))
	for _, k := range []string{"queue", "status", "machine", "step", "from", "to", "q", "state"} {
		if v, ok := f[k]; ok && len(v) > 0 {
			note(r, "sent_"+k, cut(v[0]))
		}
	}
	if v, ok := f["reason"]; ok && len(v) > 0 {
		note(r, "reason_bytes", len(v[0]))
	}
	if ids := f["id"]; len(ids) > 0 {
		shown := append([]string(nil), ids[:min(len(ids), maxNotedIDs)]...)
		for i, s := range shown {
			if len(s) > 20 {
				shown[i] = s[:20]
			}
		}
		note(r, "sent_ids", strings.Join(shown, ","), "sent_id_count", len(ids))
	}
}

// cut is s as an audit line repeats what a client sent: at most
// maxFilterLen bytes of it, cut before a character, not within one (a
// 4,000-byte reason of "é" ended its audit line in half a character:
// invalid UTF-8, a U+FFFD in a JSON log).
func cut(s string) string {
	if len(s) <= maxFilterLen {
		return s
	}
	n := maxFilterLen
	for n > maxFilterLen-utf8.UTFMax && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// signFlash adds to a bulk action's flash parameters v, for a redirect to
// target (a path relative to the base, with the page's own query if it
// has one: a list's filter), the time (at) and their signature (sig): an
// HMAC, under a key this dashboard drew at New, of the page (flashPage) and
// the flash parameters and their values.
func (d *dashboard) signFlash(target string, v url.Values) url.Values {
	path, raw, _ := strings.Cut(target, "?")
	q, _ := url.ParseQuery(raw)
	v.Set("at", strconv.FormatInt(time.Now().Unix(), 10))
	v.Set("sig", d.flashMAC(flashPage(path, q), v))
	return v
}

// flashPage is the page a flash is signed for: its path and its query
// without the flash parameters, in a canonical order. A list's filter is
// part of it: the counts of a bulk action on one filter are not shown
// under another (a hostile-operator probe carried a signed "Retried 0
// instance(s)" from one list to another).
func flashPage(path string, q url.Values) string {
	rest := url.Values{}
	for k, vs := range q {
		if !slices.Contains(flashParams, k) {
			rest[k] = vs
		}
	}
	return path + "?" + rest.Encode()
}

// flashTTL is how long a signed flash is shown: a reload soon after the
// redirect shows it again; a link kept for later, or sent to someone, does
// not.
const flashTTL = 10 * time.Minute

// flashSigned reports whether q's flash parameters carry the signature
// signFlash made for the page of path and q, less than flashTTL ago.
func (d *dashboard) flashSigned(path string, q url.Values) bool {
	at, err := strconv.ParseInt(q.Get("at"), 10, 64)
	if err != nil || time.Since(time.Unix(at, 0)) > flashTTL || time.Until(time.Unix(at, 0)) > time.Minute {
		return false
	}
	return hmac.Equal([]byte(q.Get("sig")), []byte(d.flashMAC(flashPage(path, q), q)))
}

func (d *dashboard) flashMAC(page string, v url.Values) string {
	m := hmac.New(sha256.New, d.flashKey[:])
	fmt.Fprintf(m, "%q;", page)
	for _, k := range flashParams {
		if k == "sig" {
			continue
		}
		fmt.Fprintf(m, "%s=%q;", k, v[k])
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// maxNotedIDs is how many ticked ids a refused bulk request's audit line
// repeats.
const maxNotedIDs = 20

// bulkFlash is the message after a bulk action: a fixed text with counts
// (numbers only), shown only when the redirect's signature (signFlash)
// holds, on the page it was made for, within flashTTL — a crafted link
// cannot claim counts, or that an action stopped part way and should be
// submitted again, nor carry a real one to another page or to later.
func (d *dashboard) bulkFlash(path string, q url.Values) string {
	flash := q.Get("flash")
	verb := map[string]string{"bulk-retried": "Retried", "bulk-cancelled": "Cancelled", "tree-cancelled": "Cancelled"}[flash]
	if verb == "" || !d.flashSigned(path, q) {
		return ""
	}
	num := func(k string) int64 {
		v := q.Get(k)
		if !isDigits(v) {
			return 0
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	msg := fmt.Sprintf("%s %d instance(s)", verb, num("changed"))
	if n := num("skipped"); n > 0 {
		what := "not failed"
		if verb == "Cancelled" {
			what = "already finished"
		}
		msg += fmt.Sprintf("; %d skipped (%s, or changed meanwhile)", n, what)
	}
	if n := num("not_found"); n > 0 {
		msg += fmt.Sprintf("; %d not found", n)
	}
	msg += "."
	switch {
	case q.Get("partial") == "1" && flash == "tree-cancelled":
		msg += " Stopped at the request's time limit before the end of the tree: submit again to go on."
	case q.Get("partial") == "1":
		msg += " Stopped at the request's time limit before the end of the filter: submit again to go on."
	}
	return msg
}
