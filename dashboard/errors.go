package dashboard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgconn"
)

// inputError is bad input from the request; its message is ours and safe to
// show.
type inputError string

func (e inputError) Error() string { return string(e) }

// friendly maps an error to a status and a message fit for the page. The
// engine's own error text is never shown: it may name tables, SQL or data.
func friendly(err error) (int, string, bool) {
	var in inputError
	switch {
	case errors.As(err, &in):
		return http.StatusBadRequest, string(in), true
	case errors.Is(err, gendurable.ErrNotFound):
		return http.StatusNotFound, "Not found: no such instance or machine.", true
	case errors.Is(err, gendurable.ErrNotRetryable):
		return http.StatusConflict, "Only a failed instance can be retried.", true
	case errors.Is(err, gendurable.ErrUniqueConflict):
		return http.StatusConflict, "Another live instance holds this instance's unique key, so it cannot be retried now.", true
	case errors.Is(err, gendurable.ErrNotCancellable):
		return http.StatusConflict, "The instance has already finished; only a live instance can be cancelled.", true
	case errors.Is(err, gendurable.ErrNotDelayed):
		return http.StatusConflict, "Only a runnable instance waiting for a later time (scheduled, or backing off before its next attempt) can be run now; this one is running, waiting for a signal or children, or finished.", true
	case errors.Is(err, gendurable.ErrInstanceFinished):
		return http.StatusConflict, "The instance has already finished; it accepts no more signals.", true
	case errors.Is(err, gendurable.ErrInvalidSignal):
		return http.StatusBadRequest, "Invalid signal: the name must be 1 to 200 bytes, not starting or ending with white space and holding no invisible character (zero width, filler, a stray variation selector), and the dedup key at most 1000, both valid UTF-8 without control characters or bidirectional controls (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C), and the payload JSON that PostgreSQL's jsonb can store (numbers within numeric's range, no lone UTF-16 surrogate escapes such as \\ud800) within the engine's size and nesting limits (Config.MaxSignalBytes; Config.MaxJSONDepth, 1,000 levels of arrays and objects by default).", true
	case errors.Is(err, gendurable.ErrInvalidInput):
		return http.StatusBadRequest, "Invalid input: names, filters and search text must be valid UTF-8 without control characters or bidirectional controls, names must not start or end with white space (nor, for a name a pause creates, hold an invisible character), none may be too long, and a number in a state filter must fit PostgreSQL's numeric type.", true
	case errors.Is(err, gendurable.ErrUnknownQueue):
		return http.StatusNotFound, "No such queue: it has no instances and was never paused.", true
	case errors.Is(err, gendurable.ErrInvalidConfig):
		return http.StatusBadRequest, "Invalid queue name.", true
	case errors.Is(err, gendurable.ErrNotMigrated): // before ErrSchemaVersion, which it is too
		return http.StatusServiceUnavailable, "The schema has no gendurable tables: run gendurable migrate up (with its --schema) first.", false
	case errors.Is(err, gendurable.ErrSchemaVersion):
		return http.StatusServiceUnavailable, "The schema is at another gendurable version than this dashboard's: run gendurable migrate up (with its --schema), or upgrade the dashboard.", false
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, "The request timed out. Try again, or narrow the filters.", false
	case errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, "The request was cancelled.", false
	case sqlq.PoolerAdvice(err) != "":
		// A pooler between that the database URL does not suit: the
		// operator's to fix, not a bug (a PgBouncer probe got bare 500s,
		// the advice the CLI and the engine give logged nowhere).
		return http.StatusServiceUnavailable, "A statement failed on the way to the database: " + sqlq.PoolerAdvice(err) + ".", false
	case sqlq.ConnectionFailure(err) && !isProtocolViolation(err):
		// Not an internal error: the database is down, restarting, out of
		// connections or cut off (an outage probe got "500 Internal
		// error" for it). Logged as a warning, with the error.
		return http.StatusServiceUnavailable, "The database cannot be reached (down, restarting, out of connections or cut off). Try again shortly.", false
	}
	return http.StatusInternalServerError, "", false
}

// isProtocolViolation reports SQLSTATE 08P01: a class-08 error that is a
// bug (ours or the driver's), not an outage — an internal error.
func isProtocolViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "08P01"
}

// fail answers a request that failed with err: a friendly page for the
// errors we know, "internal error" with a log reference for the rest.
func (d *dashboard) fail(w http.ResponseWriter, r *http.Request, err error) {
	code, msg, expected := friendly(err)
	if code == http.StatusInternalServerError {
		ref := newRef()
		d.log.Error("dashboard: internal error", "ref", ref, "method", r.Method, "path", r.URL.Path, "err", err)
		d.errorPage(w, r, code, "Internal error (reference "+ref+"). The details are in the server log.")
		return
	}
	if errors.Is(err, gendurable.ErrInvalidSignal) || errors.Is(err, gendurable.ErrInvalidInput) || errors.Is(err, gendurable.ErrInvalidConfig) {
		// The page's message names every rule; the action's audit line
		// says which one the input broke (a probe: a refused signal's
		// cause was recorded nowhere, the engine's error logged at Debug).
		note(r, "error", cut(err.Error()))
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client went away (or the server is stopping): nothing to
		// warn of, and one line per hang-up would let any client flood the
		// log (a probe).
		d.log.Debug("dashboard: request ended with its client gone", "method", r.Method, "path", cut(r.URL.Path), "err", err)
	} else if !expected {
		d.log.Warn("dashboard: request failed", append([]any{"method", r.Method, "path", r.URL.Path, "status", code}, sqlq.ErrAttrs(err)...)...)
	} else {
		d.log.Debug("dashboard: request refused", "method", r.Method, "path", r.URL.Path, "status", code, "err", err)
	}
	d.errorPage(w, r, code, msg)
}

func newRef() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// errorPage renders the error page with status code.
func (d *dashboard) errorPage(w http.ResponseWriter, r *http.Request, code int, msg string) {
	d.render(w, r, code, "error", "Error", "", errorData{Code: code, Status: http.StatusText(code), Message: msg, Back: d.backLink(r)})
}

type errorData struct {
	Code    int
	Status  string
	Message string
	Back    string
}

// backLink is where the error page's "back" link goes: the instance of an
// instance action, the queues page otherwise.
func (d *dashboard) backLink(r *http.Request) string {
	p := r.URL.Path
	if rest, ok := strings.CutPrefix(p, "/instances/"); ok {
		id, _, _ := strings.Cut(rest, "/")
		if isDigits(id) {
			return d.link("/instances/" + id)
		}
		return d.link("/instances")
	}
	if strings.HasPrefix(p, "/machines/") {
		return d.link("/machines")
	}
	return d.link("/")
}

func isDigits(s string) bool {
	if s == "" || len(s) > 19 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Flash messages: a redirect after a POST names one by key, so a link
// cannot make the page say anything else.
var flashes = map[string]string{
	"retried":          "Retried: the instance is runnable again at the step it failed in.",
	"cancelled":        "Cancelled: the instance is failed.",
	"ran-now":          "Eligible now: the next worker that polls its queue runs it, with its attempt count kept.",
	"ran-now-lease":    "Not eligible now: it becomes eligible when the lease of its cancelled step ends (that step may still be running until then), with its attempt count kept.",
	"retried-lease":    "Retried: the instance is runnable again at the step it failed in; it becomes eligible when the lease of its cancelled step ends (that step may still be running until then).",
	"retried-children": "Retried: the instance awaits its live children again, then runs the step it failed in.",
	"retried-wait":     "Retried: the instance is runnable again at the step it failed in, but keeps the wait it was cancelled in: it becomes eligible at the time shown (Run now makes it eligible at once).",
	"retried-await":    "Retried: the instance was cancelled while it awaited signals, and awaits them again (the cancel consumed the ones it had).",
	"signalled":        "Signal sent; it waits in the instance's inbox.",
	"signal-woke":      "Signal sent; it woke the instance.",
	"signal-duplicate": "Nothing sent: a signal with this dedup key was already delivered.",
	"paused":           "Queue paused: no process picks from it until it is resumed.",
	"resumed":          "Queue resumed.",
}

// flashParams are the query parameters of a flash message: a reload or a
// link made from the page drops them.
var flashParams = []string{"flash", "changed", "skipped", "not_found", "partial", "at", "sig"}

// flashOf is the flash message of a page: a bulk action's, or a single
// action's fixed text — either shown only under the signature of the
// redirect that named it (signFlash), so a crafted link cannot make a page
// say that an action was taken ("Cancelled: the instance is failed." on a
// done instance, before a hostile-operator probe).
func (d *dashboard) flashOf(r *http.Request) string {
	q := r.URL.Query()
	if m := d.bulkFlash(r.URL.Path, q); m != "" {
		return m
	}
	m := flashes[q.Get("flash")]
	if m == "" || !d.flashSigned(r.URL.Path, q) {
		return ""
	}
	return m
}

// redirect answers a POST with 303 to path (relative to the base) with a
// flash key, signed (signFlash).
func (d *dashboard) redirect(w http.ResponseWriter, r *http.Request, path, flash string) {
	v := d.signFlash(path, url.Values{"flash": {flash}})
	http.Redirect(w, r, d.link(path)+"?"+v.Encode(), http.StatusSeeOther)
}
