package dashboard

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gendurable/gendurable/internal/display"
)

// LevelAudit is the level of the audit trail (Options.AuditLogger): Warn,
// so that a logger that keeps only warnings and errors, as `gendurable ui`
// does for everything else, still records every action and failed login.
const LevelAudit = slog.LevelWarn

// Failed logins and refused actions (the audit trail), and refused hosts
// and cross-origin requests (warnings), are logged at most failureLogBurst
// times per failureLogWindow per client, each kind with its own allowance
// (logLimiter); a window that left lines out ends with a line saying how
// many. At most failureLogIPs clients are tracked; past that, the rest
// share one allowance.
const (
	failureLogBurst  = 5
	failureLogWindow = time.Minute
	failureLogIPs    = 4096
)

// auditRecord collects what a mutation's handler knows about its action
// (ids, names, results) for the one audit line the mutation wrapper writes.
type auditRecord struct {
	mu    sync.Mutex
	attrs []any
}

type auditKey struct{}

// note adds key-value pairs to the request's audit line.
func note(r *http.Request, kv ...any) {
	if rec, ok := r.Context().Value(auditKey{}).(*auditRecord); ok {
		rec.mu.Lock()
		rec.attrs = append(rec.attrs, kv...)
		rec.mu.Unlock()
	}
}

// statusWriter remembers the status code of the answer.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logAudit writes a mutation's audit line: who, what, which ids, from where,
// and how it ended (a redirect after a POST is success; anything else was
// refused or failed).
func (d *dashboard) logAudit(r *http.Request, action string, rec *auditRecord, code int) {
	outcome := "ok"
	if code != http.StatusSeeOther {
		outcome = "refused"
		if code >= 500 || code == 0 {
			outcome = "failed"
		}
	}
	rec.mu.Lock()
	noted := slices.Clone(rec.attrs)
	rec.mu.Unlock()
	var cutLens []any // key_bytes, length: the strings cut below
	for i := 0; i+1 < len(noted); i += 2 {
		if noted[i] == "partial" && noted[i+1] == true && (outcome == "failed" || outcome == "ok") {
			// Cut short after changing some: the client hung up (failed),
			// or the request's timeout ended the run (ok: the redirect
			// says partial=1). A run of the timeout's read "ok" before.
			outcome = "partial"
		}
		if v, ok := noted[i+1].(string); ok && len(v) > maxFilterLen {
			// A refused request's names are any length, and a cancel's
			// reason up to gendurable.MaxReasonBytes: the line says how
			// long the whole was, or a reason of 4,000 bytes read as one
			// of 1,000 (a hostile probe).
			noted[i+1] = cut(v)
			if k, ok := noted[i].(string); ok && !slices.Contains(noted, any(k+"_bytes")) {
				cutLens = append(cutLens, k+"_bytes", len(v))
			}
		}
	}
	noted = append(noted, cutLens...)
	// A refused request changed nothing, and anyone who can reach the
	// dashboard can send them: within the refused actions' allowance, per
	// client and user (a line at the window's end counts the rest).
	if outcome == "refused" && !d.refuseLimit.allow(refuser(r), time.Now()) {
		return
	}
	attrs := append([]any{"action", action, "outcome", outcome, "status", code, "user", auditUser(r),
		"remote", r.RemoteAddr, "path", cut(r.URL.Path)}, noted...)
	if r.URL.RawQuery != "" {
		// A pause's or resume's queue travels in the query (queueURL): a
		// refused one (read-only, a form refused) did not say which.
		attrs = append(attrs, "query", cut(r.URL.RawQuery))
	}
	attrs = append(attrs, forwardedFor(r)...)
	d.auditor.Log(r.Context(), LevelAudit, "dashboard audit: "+action, attrs...)
}

// forwardedFor is the attribute an audit or warning line gives a request's
// X-Forwarded-For, if it has one: as the client (and the proxies on its
// way) sent it, every header line, not verified. Behind a proxy every
// remote is the proxy's address; a line without it did not say whom a
// refused cross-origin action or a failed login came from.
func forwardedFor(r *http.Request) []any {
	if fs := r.Header.Values("X-Forwarded-For"); len(fs) > 0 {
		return []any{"forwarded_for", cut(strings.Join(fs, ", "))}
	}
	return nil
}

// auditUser is the user an audit line names.
func auditUser(r *http.Request) string {
	if u := userOf(r); u != "" {
		return u
	}
	return "(no authentication configured)"
}

// refuser is whom a refused action's allowance is kept for: the client
// (clientOf) and the user signed in, if any.
func refuser(r *http.Request) string {
	if u := userOf(r); u != "" {
		return clientOf(r) + " user " + u
	}
	return clientOf(r)
}

// failedLogin records credentials that were presented and did not match,
// within the audit trail's allowance per client (auditLimit).
func (d *dashboard) failedLogin(r *http.Request) {
	if !d.auditLimit.allow(clientOf(r), time.Now()) {
		return
	}
	attrs := []any{"action", "login", "outcome", "failed", "remote", r.RemoteAddr, "method", r.Method, "path", cut(r.URL.Path)}
	if u, _, isBasic := r.BasicAuth(); isBasic {
		if len(u) > 64 {
			u = u[:64]
		}
		attrs = append(attrs, "scheme", "basic", "user", u)
	} else {
		// As sent: "Basic !!!" (not base64) is a basic login that did not
		// decode, not a bearer token; another word is another scheme.
		scheme, _, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		switch scheme = strings.ToLower(scheme); scheme {
		case "bearer":
		case "basic":
			scheme = "basic (not decodable)"
		default:
			scheme = "other"
		}
		attrs = append(attrs, "scheme", scheme)
	}
	attrs = append(attrs, forwardedFor(r)...)
	d.auditor.Log(r.Context(), LevelAudit, "dashboard audit: failed login", attrs...)
}

func remoteIP(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

// logLimiter allows a few log lines per client per window (a remote IPv4
// address, or an IPv6 /64: one host has a whole /64 to send from). A
// window in which lines were left out ends with one line saying how many
// (report, called once the window has passed, from a timer or from the
// client's next line, whichever comes first), on the logger the lines
// left out would have gone to.
type logLimiter struct {
	mu     sync.Mutex
	m      map[string]*logBucket
	after  func(time.Duration, func())                       // time.AfterFunc; a test's clock
	report func(client string, dropped int, since time.Time) // a window's lines left out
}

type logBucket struct {
	start      time.Time
	n, dropped int
	window     int // counts windows: a timer set in an earlier one does nothing
}

func newLogLimiter(report func(client string, dropped int, since time.Time)) *logLimiter {
	return &logLimiter{m: map[string]*logBucket{}, report: report,
		after: func(d time.Duration, f func()) { time.AfterFunc(d, f) }}
}

// allow reports whether a line for client may be logged at now. A count
// of the client's previous window's lines left out is reported first.
func (l *logLimiter) allow(client string, now time.Time) bool {
	l.mu.Lock()
	b := l.m[client]
	if b == nil {
		if len(l.m) >= failureLogIPs {
			for k, v := range l.m {
				if now.Sub(v.start) >= failureLogWindow && v.dropped == 0 {
					delete(l.m, k)
				}
			}
			if len(l.m) >= failureLogIPs {
				client = otherClients
			}
		}
		if b = l.m[client]; b == nil {
			b = &logBucket{start: now}
			l.m[client] = b
		}
	}
	dropped, since := 0, b.start
	if now.Sub(b.start) >= failureLogWindow {
		dropped = b.dropped
		b.start, b.n, b.dropped = now, 0, 0
		b.window++
	}
	ok := b.n < failureLogBurst
	if ok {
		b.n++
	} else if b.dropped++; b.dropped == 1 {
		window := b.window
		l.after(b.start.Add(failureLogWindow).Sub(now), func() { l.expire(client, b, window) })
	}
	l.mu.Unlock()
	if dropped > 0 {
		l.report(client, dropped, since)
	}
	return ok
}

// expire reports b's lines left out once its window has passed, unless a
// line of the client's reported them already.
func (l *logLimiter) expire(client string, b *logBucket, window int) {
	l.mu.Lock()
	dropped, since := 0, b.start
	if b.window == window {
		dropped, b.dropped = b.dropped, 0
	}
	l.mu.Unlock()
	if dropped > 0 {
		l.report(client, dropped, since)
	}
}

// otherClients is the one allowance of clients past failureLogIPs.
const otherClients = "(other addresses)"

// clientOf is the limiters' name for r's client: its remote IP, an IPv6
// address's /64.
func clientOf(r *http.Request) string {
	h := remoteIP(r)
	ip, err := netip.ParseAddr(h)
	if err != nil || !ip.Is6() || ip.Is4In6() {
		return h
	}
	p, err := ip.WithZone("").Prefix(64)
	if err != nil {
		return h
	}
	return p.String()
}

// inertHandler passes records on to h with DEL, C1 controls (U+0080–U+009F)
// and bidirectional controls (U+202E, ...) in the message and in string
// values written as the text \u009b (display.Inert): slog's JSON handler
// writes those as they are, and log lines carry what a client sent — the
// user name of a failed login and the path of a refused request before any
// authentication, a cancel's reason after it — to a terminal that may act
// on an 8-bit CSI or show the line reordered. (C0 controls and invalid
// UTF-8 both of slog's handlers escape.)
type inertHandler struct{ h slog.Handler }

func (h inertHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.h.Enabled(ctx, l) }

func (h inertHandler) Handle(ctx context.Context, r slog.Record) error {
	nr := slog.NewRecord(r.Time, r.Level, display.Inert(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		nr.AddAttrs(inertAttr(a))
		return true
	})
	return h.h.Handle(ctx, nr)
}

func (h inertHandler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = inertAttr(a)
	}
	return inertHandler{h.h.WithAttrs(clean)}
}

func (h inertHandler) WithGroup(name string) slog.Handler { return inertHandler{h.h.WithGroup(name)} }

func inertAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, display.Inert(v.String()))
	case slog.KindGroup:
		g := v.Group()
		clean := make([]any, len(g))
		for i, ga := range g {
			clean[i] = inertAttr(ga)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, display.Inert(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, display.Inert(x.String()))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
