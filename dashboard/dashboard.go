// Package dashboard is gendurable's operator web UI: an [http.Handler] that
// shows queues, instances and machine graphs, and lets an operator retry,
// cancel, signal and run now instances and pause or resume queues.
//
// Mount it in your own server:
//
//	h, err := dashboard.New(eng, dashboard.Options{
//		BasePath:  "/admin/gendurable",
//		BasicAuth: &dashboard.BasicAuth{User: "ops", Password: os.Getenv("UI_PASSWORD")},
//	})
//	if err != nil { ... }
//	mux.Handle("/admin/gendurable/", h)
//
// The pages are rendered on the server with html/template; the stylesheet
// and a little JavaScript (confirmation prompts, the bulk selection count,
// auto-refresh without a page flash) are embedded in the binary. Nothing is
// loaded from elsewhere, and every page works without JavaScript.
//
// # Pages
//
//   - / — queues: counts by status (an aggregate over every instance,
//     shared between requests for 2 s, read afresh after an action of
//     this dashboard), total, paused flag, pause/resume, and
//     throughput: a chart (inline SVG) of the instances finished per minute
//     over the last hour and each queue's done and failed per minute over
//     the last five, from [gendurable.Engine.Throughput] (the database's
//     finish times, a bounded read shared for a few seconds; while one
//     request refreshes it, the others are shown the previous one).
//   - /instances — the list, with filters (queue, status, machine, step,
//     inserted from/to in UTC, search by id, partition key or unique key,
//     state contains a JSON document) and keyset paging, at most
//     [MaxPageSize] rows a page. A search is an index lookup; a page looks at
//     no more than [gendurable.DefaultListScan] instances, and says so when
//     it stopped there before filling up (its "Older" link continues below
//     them). Bulk retry and cancel act on ticked rows (at most
//     [MaxPageSize]) or on every instance the filter matches (a filter
//     without criteria is refused; a state filter of {} or [] is none).
//   - /instances/{id} — state, result, a timeline (inserted, errors,
//     signals, children, finish on one axis), the error history (a panic's
//     stack trace collapsed under it), signals, children, parent, unique
//     key, what it waits for; retry, cancel and signal, run now for a
//     scheduled or backing-off instance ([gendurable.Engine.RunNow]), and,
//     for an instance with children, cancel with every live descendant,
//     parents first ([gendurable.Engine.CancelTree]).
//
// Any of these pages given ?refresh=N (2 to 300 seconds) refreshes itself:
// with JavaScript the page is fetched and swapped in place, skipping a turn
// while the reader types, has rows ticked or text selected, or the tab is
// hidden; without it a <noscript> meta refresh reloads it.
//   - /machines and /machines/{name} — registered machines, and a machine's
//     steps drawn as a graph (inline SVG) with counts by status and the
//     transitions the engine's process has observed (a known machine's
//     graph is shared between requests for 2 s, as the queues' counts
//     are, and so are the names of the machines the dashboard knows,
//     which the queues, list and graph pages read). A machine whose name a
//     path cannot carry — "." or ".." (which a browser would resolve out of
//     a path), "/" or any other that makes the path unclean (which the
//     router redirects) — is /machines?name=.., and such a queue's pause
//     and resume are /queues/pause?queue=.. and /queues/resume?queue=...
//
// # Security
//
//   - Authentication: Options.BasicAuth and/or Options.BearerToken (trimmed of
//     white space, like the presented token). Credentials are compared in
//     constant time; a missing or wrong one gets 401 with a
//     WWW-Authenticate challenge. With neither set, the handler serves anyone
//     who can reach it: bind it to loopback ([DefaultAddr]) or put it behind
//     your own authentication.
//   - Options.ReadOnly: every mutating route answers 403 and the pages show
//     no buttons.
//   - Mutations are POST only (other methods get 405) and pass through
//     [http.CrossOriginProtection]: a cross-origin browser request (by its
//     Sec-Fetch-Site or Origin header) gets 403. Behind a proxy that rewrites
//     Host, list the public origin in Options.TrustedOrigins.
//   - Host check against DNS rebinding: only a Host naming the address the
//     client connected to, a loopback address, localhost or one of
//     Options.AllowedHosts is served; anything else gets 421 before
//     authentication.
//   - A request that is refused (unknown host, missing or wrong
//     credentials) is answered without reading its body, and its connection
//     is closed.
//   - Serve the handler with [NewServer] (read-header, read, write and idle
//     timeouts, a header size limit) on a [LimitListener] (a bound on open
//     connections; when they are all taken, one lingering after its
//     last answer, or the one idle longest or open without a whole
//     request header, is closed to make room), as
//     `gendurable ui` does, or give your own server the same bounds.
//   - Audit trail: one line per action (refused ones too, cross-origin
//     POSTs included, at most five a minute per client and user; what a
//     client sent — names, a cancel's reason — is cut to 1000 bytes, before
//     a character, and a value cut has its whole length beside it, as
//     reason_bytes; a bulk action's
//     line names its ids or filter, its counts and the ids it changed, the
//     first [gendurable.MaxBulkIDs], with changed_ids_truncated past
//     them) and per failed
//     login (at most five a minute per client — a
//     remote IPv4 address or IPv6 /64; each allowance's minute ends with a
//     line counting the rest) on Options.AuditLogger at [LevelAudit], with who,
//     what, which ids, from where and the outcome. Warnings a client can
//     cause without credentials (a host name not served) have an allowance
//     of their own and cannot use up the audit trail's.
//   - Every request runs under a timeout (Options.RequestTimeout).
//   - Lists are bounded (at most [MaxPageSize] rows a page); request bodies
//     are bounded too.
//   - Options.Redact sees every state, result and signal payload before it is
//     shown.
//   - Error text from the engine or the database never reaches the page:
//     known errors get a fixed, friendly message and a matching status
//     (404, 409, 400); anything else is logged with Options.Logger and shown
//     as "internal error" with a reference to find the log line.
//   - Responses carry Content-Security-Policy (default-src 'self'),
//     X-Content-Type-Options, X-Frame-Options, Referrer-Policy and, for pages,
//     Cache-Control: no-store.
//   - Bidirectional controls (U+202E RIGHT-TO-LEFT OVERRIDE and its kin),
//     which html/template leaves as they are, are shown as the text \u202e
//     wherever stored data carries one (states, payloads, error messages,
//     cancel reasons), so no text reads in another order than it is
//     stored; names and keys cannot hold one (the engine refuses them).
//     Other control characters (but tab and newline), DEL and C1 controls,
//     which a browser shows as nothing, are shown as the CLI shows them
//     (\x1b, \u009b).
//   - A signal's name is sent as typed, as the CLI and the API send it: one
//     that starts or ends with white space is refused (400), not trimmed
//     into another name.
//   - After a POST the handler redirects (303) to a page whose query string
//     names a flash message from a fixed list (a bulk action's adds counts,
//     read as numbers), shown only under a signature the dashboard made
//     for that page within the last ten minutes, so a crafted link cannot
//     make the page display arbitrary text, nor claim that an action was
//     taken, with what counts, or that it stopped part way. The signing
//     key is drawn per process: behind several replicas, a flash shows
//     only where the redirected request reaches the one that made it.
package dashboard

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"mime"
	"net"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/gendurable/gendurable"
)

// DefaultAddr is the address `gendurable ui` listens on unless told
// otherwise: loopback only.
const DefaultAddr = "127.0.0.1:8080"

// Defaults and bounds of Options.
const (
	DefaultPageSize = 50
	// MaxPageSize bounds a list page's ?limit= and the rows a bulk action
	// ticks: the bound of Engine.List and of `gendurable list --limit`
	// (a larger ?limit= is refused with 400, as the CLI refuses it).
	MaxPageSize           = gendurable.MaxListLimit
	DefaultRequestTimeout = 10 * time.Second
	// MaxFormBytes bounds the body of a POST (a signal's payload travels in it).
	MaxFormBytes = 2 << 20
)

// BasicAuth is a user name and password for HTTP Basic authentication.
type BasicAuth struct {
	User     string
	Password string
}

// Options configure the dashboard. The zero value is usable: mounted at the
// root, no authentication, read-write.
type Options struct {
	// BasePath is the URL path the handler is mounted at, e.g. "/admin"
	// ("" or "/" for the root): clean (no "." or ".." segment, no "//"),
	// without "?", "#", "%", a backslash or control characters. Every link
	// and redirect starts with it.
	// Requests may reach the handler with the prefix (mux.Handle("/admin/", h))
	// or without it (http.StripPrefix): both work.
	BasePath string

	// BasicAuth, if set, requires these credentials (HTTP Basic).
	BasicAuth *BasicAuth
	// BearerToken, if set, requires "Authorization: Bearer <token>". When
	// both BasicAuth and BearerToken are set, either is accepted. New
	// refuses a token, user or password with a control character (no
	// header or login form could carry it).
	BearerToken string

	// ReadOnly hides every action and makes every mutating route answer 403.
	ReadOnly bool

	// TrustedOrigins are origins (scheme://host[:port]) whose cross-origin
	// POSTs are accepted, for a proxy that changes the Host header.
	TrustedOrigins []string

	// AllowedHosts are the names the Host header may carry besides the
	// address the client connected to, loopback addresses and "localhost"
	// (which are always served): e.g. "ops.example.com" or
	// "ops.example.com:8443" (with a port, only that port). A request for
	// any other host gets 421, so a page whose DNS name was rebound to the
	// dashboard's address cannot read or act through it. Mounted behind a
	// proxy, list the public name; "*" turns the check off (for a server
	// that checks Host itself). There are no wildcards within a name
	// ("*.example.com" is refused, as is a port outside 1–65535).
	AllowedHosts []string

	// RequestTimeout bounds the work of one request. Default 10s.
	RequestTimeout time.Duration

	// PageSize is the default number of instances a list page shows; a
	// request may ask for up to MaxPageSize. Default 50.
	PageSize int

	// Redact, if set, is applied to every instance state, result and
	// signal payload before display; machine is the instance's machine
	// name. Return the JSON to show (e.g. with secrets replaced).
	// A "State contains" filter that Redact would change (given the
	// filter as a document of the filter's machine) names hidden data and
	// is refused with 400, in the list and in bulk actions: listing an
	// instance by it would tell whether a guess of the hidden value is
	// right. With Redact set, a "State contains" filter without a machine
	// is refused too (Redact could not be asked about the machines of
	// instances no engine started with).
	Redact func(machine string, data json.RawMessage) json.RawMessage

	// Logger receives internal errors and refusals. Default slog.Default().
	// The dashboard's lines (audit lines too) carry what clients sent —
	// the user name of a failed login, the path of a refused request,
	// a cancel's reason — with DEL, C1 controls and bidirectional
	// controls in strings written as \u escapes, which slog's JSON
	// handler would write as they are.
	Logger *slog.Logger

	// AuditLogger receives the audit trail, at [LevelAudit]: one line per
	// mutation (pause, resume, retry, cancel, cancel with descendants, run
	// now, signal, bulk retry and cancel — refused ones too) with who, what,
	// which ids (or filter), from where and the outcome, and one per failed
	// login (credentials presented and wrong). Failed logins are at most
	// five a minute per client (remote IPv4 address or IPv6 /64), refused
	// actions five a minute per client and user, each with an allowance of
	// its own; a line at the minute's end counts the rest. An action done
	// (ok, failed or partial: a bulk action or a cancel with descendants
	// cut short by RequestTimeout, or by the client hanging up after
	// changing some; its counts say what it changed) is always logged.
	// Default Logger.
	AuditLogger *slog.Logger

	// Title shown in the header. Default "gendurable".
	Title string
}

// dashboard is the handler's shared state.
type dashboard struct {
	eng     *gendurable.Engine
	opts    Options
	base    string
	log     *slog.Logger
	auditor *slog.Logger
	pages   pages
	tp      shared[*gendurable.Throughput]
	// queueStats: the queues page's counts, shared between requests for
	// queueStatsTTL; reset by every action of this dashboard that succeeds.
	queueStats shared[[]gendurable.QueueStats]
	graphs     graphs // each known machine's graph, shared for graphTTL; reset as queueStats
	// machines: the names of the machines the dashboard knows
	// (machineNames), shared for machineNamesTTL; no action changes them.
	machines shared[[]string]
	handler  http.Handler

	basicUser, basicPass [32]byte // SHA-256 of the configured credentials
	bearer               [32]byte

	anyHost bool            // AllowedHosts holds "*"
	allowed map[string]bool // AllowedHosts, lower case
	// Per client (logLimiter): failed logins and refused actions (the audit
	// trail); refused hosts and cross-origin requests (warnings).
	// auditLimit: failed logins, per client; refuseLimit: refused actions,
	// per client and user (so that failed logins from an address shared
	// with the operators, a proxy's, cannot silence their refusals);
	// warnLimit: warnings a client causes without credentials.
	auditLimit, refuseLimit, warnLimit *logLimiter
	flashKey                           [32]byte // signs bulk actions' flash counts (signFlash)
	// actionOf names the action whose route a POST of r's path takes, ""
	// if none (the path without the base).
	actionOf func(r *http.Request) string
}

// New returns the dashboard for eng as an http.Handler.
func New(eng *gendurable.Engine, opts Options) (http.Handler, error) {
	if eng == nil {
		return nil, errors.New("dashboard: nil engine")
	}
	base := strings.TrimRight(opts.BasePath, "/")
	if base != "" && (!strings.HasPrefix(base, "/") || path.Clean(base) != base || strings.ContainsAny(base, "?#%\\") || hasControl(base)) {
		// Not clean ("/a/../b", "/.", "//a"): a browser resolves the links'
		// dot segments away from the base. With "%": the links carry it
		// as written, the request's path arrives decoded and no longer
		// starts with the base. Either way every link would miss. With
		// "\": a browser reads "/\evil.example" as "//evil.example",
		// and every redirect would leave the site (a probe).
		return nil, fmt.Errorf("dashboard: BasePath %q must be a clean absolute path like /admin (no . or .. segments, //, ?, #, %%, \\ or control characters)", opts.BasePath)
	}
	if a := opts.BasicAuth; a != nil && (a.User == "" || a.Password == "" || strings.Contains(a.User, ":")) {
		return nil, errors.New("dashboard: BasicAuth needs a non-empty User (without ':') and Password")
	}
	if a := opts.BasicAuth; a != nil && (hasControl(a.User) || hasControl(a.Password)) {
		// RFC 7617: no control characters; a browser's login form cannot
		// type one, so nobody could log in.
		return nil, errors.New("dashboard: BasicAuth holds a control character (a line break from a file?): no browser could log in with it")
	}
	if tok := opts.BearerToken; tok != "" {
		// Trimmed like the presented token, so " x" can log in with "x".
		if opts.BearerToken = strings.TrimSpace(tok); opts.BearerToken == "" {
			return nil, errors.New("dashboard: BearerToken is only white space")
		}
		if hasControl(opts.BearerToken) {
			// An HTTP header cannot carry one: no client could present it.
			return nil, errors.New("dashboard: BearerToken holds a control character (a line break from a file?): no client could present it")
		}
	}
	allowed := map[string]bool{}
	anyHost := false
	for _, h := range opts.AllowedHosts {
		switch {
		case h == "*":
			anyHost = true
		case h == "" || strings.ContainsAny(h, "/?#@ \t\r\n"):
			return nil, fmt.Errorf("dashboard: AllowedHosts: %q is not a host name or host:port", h)
		case strings.IndexFunc(h, func(r rune) bool { return r <= ' ' || r >= 0x7f }) >= 0:
			// No Host header carries one (net/http refuses it): the entry
			// would fail closed, silently (a probe: ESC, U+202E).
			return nil, fmt.Errorf("dashboard: AllowedHosts: %q holds a control or non-ASCII character, which no Host header carries (write an international name as its xn-- form)", h)
		case strings.Contains(h, "*"):
			// It would match only a Host header that says "*.example.com"
			// itself: the check fails closed, but silently (a probe).
			return nil, fmt.Errorf("dashboard: AllowedHosts: %q: no wildcards within a name; list each name, or \"*\" alone for any", h)
		case hostPortProblem(h) != "":
			return nil, fmt.Errorf("dashboard: AllowedHosts: %q %s", h, hostPortProblem(h))
		}
		allowed[strings.ToLower(strings.TrimSuffix(h, "."))] = true
	}
	switch {
	case opts.RequestTimeout < 0:
		return nil, errors.New("dashboard: negative RequestTimeout")
	case opts.RequestTimeout == 0:
		opts.RequestTimeout = DefaultRequestTimeout
	}
	switch {
	case opts.PageSize < 0 || opts.PageSize > MaxPageSize:
		return nil, fmt.Errorf("dashboard: PageSize must be within 0..%d", MaxPageSize)
	case opts.PageSize == 0:
		opts.PageSize = DefaultPageSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.AuditLogger == nil {
		opts.AuditLogger = opts.Logger
	}
	// What a client sent reaches these lines: see inertHandler.
	opts.Logger = slog.New(inertHandler{opts.Logger.Handler()})
	opts.AuditLogger = slog.New(inertHandler{opts.AuditLogger.Handler()})
	if opts.Title == "" {
		opts.Title = "gendurable"
	}
	d := &dashboard{eng: eng, opts: opts, base: base, log: opts.Logger, auditor: opts.AuditLogger,
		anyHost: anyHost, allowed: allowed}
	if _, err := rand.Read(d.flashKey[:]); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	d.auditLimit = newLogLimiter(func(client string, dropped int, since time.Time) {
		d.auditor.Log(context.Background(), LevelAudit, "dashboard audit: lines left out",
			"left_out", dropped, "client", client, "since", since.UTC(), "what", "failed logins, over the allowance")
	})
	d.refuseLimit = newLogLimiter(func(client string, dropped int, since time.Time) {
		d.auditor.Log(context.Background(), LevelAudit, "dashboard audit: lines left out",
			"left_out", dropped, "client", client, "since", since.UTC(), "what", "refused actions, over the allowance")
	})
	d.warnLimit = newLogLimiter(func(client string, dropped int, since time.Time) {
		d.log.Warn("dashboard: warnings left out", "left_out", dropped, "client", client, "since", since.UTC(),
			"what", "refused host names and cross-origin requests, over the allowance")
	})
	if a := opts.BasicAuth; a != nil {
		d.basicUser, d.basicPass = sha256.Sum256([]byte(a.User)), sha256.Sum256([]byte(a.Password))
	}
	if opts.BearerToken != "" {
		d.bearer = sha256.Sum256([]byte(opts.BearerToken))
	}
	var err error
	if d.pages, err = parsePages(d); err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	actions := map[string]string{} // route pattern → action, for the audit line of a refused one
	mutation := func(pattern, action string, h http.HandlerFunc) {
		actions[pattern] = action
		mux.Handle(pattern, d.mutation(action, h))
	}
	mux.HandleFunc("GET /{$}", d.queuesPage)
	mux.HandleFunc("GET /instances", d.listPage)
	mux.HandleFunc("GET /instances/{id}", d.instancePage)
	mux.HandleFunc("GET /machines", d.machinesPage)
	mux.HandleFunc("GET /machines/{name}", d.graphPage)
	mux.HandleFunc("GET /static/{file}", func(w http.ResponseWriter, r *http.Request) {
		if !serveStatic(w, r) {
			d.errorPage(w, r, http.StatusNotFound, "No such page.") // as any other path's 404
		}
	})
	mutation("POST /queues/{queue}/pause", "pause", d.pauseAction)
	mutation("POST /queues/{queue}/resume", "resume", d.resumeAction)
	// Queues whose names a path cannot carry ("." and "..", "/": pathCarries).
	mutation("POST /queues/pause", "pause", d.pauseAction)
	mutation("POST /queues/resume", "resume", d.resumeAction)
	mutation("POST /bulk/retry", "bulk-retry", d.bulkRetryAction)
	mutation("POST /bulk/cancel", "bulk-cancel", d.bulkCancelAction)
	mutation("POST /instances/{id}/retry", "retry", d.retryAction)
	mutation("POST /instances/{id}/cancel", "cancel", d.cancelAction)
	mutation("POST /instances/{id}/cancel-tree", "cancel-tree", d.cancelTreeAction)
	mutation("POST /instances/{id}/signal", "signal", d.signalAction)
	mutation("POST /instances/{id}/run-now", "run-now", d.runNowAction)
	d.actionOf = func(r *http.Request) string {
		post := r.Clone(r.Context())
		post.Method = http.MethodPost
		_, pattern := mux.Handler(post)
		return actions[pattern]
	}

	// Cross-origin protection covers every route: it lets safe methods
	// through and rejects cross-origin POSTs before any handler runs.
	cop := http.NewCrossOriginProtection()
	for _, o := range opts.TrustedOrigins {
		if err := cop.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("dashboard: TrustedOrigins: %w", err)
		}
	}
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attrs := []any{"method", r.Method, "path", cut(r.URL.Path), "origin", cut(r.Header.Get("Origin")),
			"sec_fetch_site", cut(r.Header.Get("Sec-Fetch-Site")), "remote", r.RemoteAddr}
		if r.URL.RawQuery != "" {
			attrs = append(attrs, "query", cut(r.URL.RawQuery)) // a pause's queue travels there
		}
		if _, pattern := mux.Handler(r); actions[pattern] != "" {
			// A refused action: on the audit trail (within the refused
			// actions' allowance, per client and user, an allowance of its
			// own: a hostile page the operator opens sends these with the
			// operator's credentials, and used up the one of the
			// operator's own refused actions — a probe), with who was
			// signed in.
			if d.refuseLimit.allow(refuser(r)+" cross-origin", time.Now()) {
				d.auditRefused(r, actions[pattern], http.StatusForbidden, "cross-origin", auditUser(r), attrs...)
			}
		} else if d.warnLimit.allow(clientOf(r), time.Now()) {
			d.log.Warn("dashboard: cross-origin request rejected", append(attrs, forwardedFor(r)...)...)
		}
		d.errorPage(w, r, http.StatusForbidden, "Cross-origin request refused. Use the dashboard's own buttons.")
	}))
	d.handler = cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			if _, err := url.ParseQuery(r.URL.RawQuery); err != nil && r.Method != http.MethodPost {
				// A page reads its query with URL.Query, which drops a
				// pair it cannot parse (one holding a ';') without a word:
				// a list of "status=failed&queue=a;b" showed every failed
				// instance, and its "Cancel all" confirmed the wider
				// filter. (A mutation's form parser refuses it, audited.)
				msg := "The address's query could not be read (a bad %-escape)."
				if strings.Contains(r.URL.RawQuery, ";") {
					msg = "The address's query could not be read (a ';' is no separator: use '&')."
				}
				d.errorPage(w, r, http.StatusBadRequest, msg)
				return
			}
			mux.ServeHTTP(w, r)
			return
		}
		// Not routed: a path to clean (a redirect), a method a route does
		// not take (405), or no such page. The last gets the dashboard's
		// own 404 (no-store, a way back), not the mux's plain text; the
		// others are the mux's, answered as it answers them.
		rec := &recorded{header: http.Header{}, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		if rec.code == http.StatusMethodNotAllowed {
			d.auditWrongMethod(r)
		}
		if rec.code == http.StatusNotFound {
			d.errorPage(w, r, http.StatusNotFound, "No such page.")
			return
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.code)
		_, _ = w.Write(rec.body.Bytes())
	}))
	return d, nil
}

// hasControl reports whether s holds a control character (C0, DEL or C1).
func hasControl(s string) bool { return strings.ContainsFunc(s, unicode.IsControl) }

// ServeHTTP applies the security headers, authentication and timeout, strips
// the base path, and routes.
func (d *dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")

	if !d.hostAllowed(r) {
		// Before authentication, without reading the body, and the
		// connection closes after the answer.
		if d.warnLimit.allow(clientOf(r), time.Now()) {
			d.log.Warn("dashboard: request for a host not served (DNS rebinding?); add it to AllowedHosts if it is yours",
				"host", cut(r.Host), "method", r.Method, "path", cut(r.URL.Path), "remote", r.RemoteAddr)
		}
		refuse(w, r, http.StatusMisdirectedRequest, "421 misdirected request: this dashboard does not serve that host name\n")
		return
	}
	user, ok := d.authenticate(r)
	if !ok {
		if r.Header.Get("Authorization") != "" {
			d.failedLogin(r)
		}
		if r.Method == http.MethodPost {
			d.auditUnauthenticated(r)
		}
		if d.opts.BasicAuth != nil {
			h.Add("WWW-Authenticate", `Basic realm="gendurable", charset="UTF-8"`)
		}
		if d.opts.BearerToken != "" {
			h.Add("WWW-Authenticate", `Bearer realm="gendurable"`)
		}
		refuse(w, r, http.StatusUnauthorized, "401 unauthorized\n")
		return
	}

	ctx, cancel := context.WithTimeout(r.Context(), d.opts.RequestTimeout)
	defer cancel()
	ctx = context.WithValue(ctx, userKey{}, user)
	r2 := r.WithContext(ctx)
	if d.base != "" {
		r2.URL = stripBase(r.URL, d.base)
		w = &baseRedirect{ResponseWriter: w, base: d.base}
	}
	d.handler.ServeHTTP(w, r2)
}

// recorded is a response kept to be looked at before it is sent: the mux's
// answer to a request no route took (a few bytes: a redirect, a 405, a 404).
type recorded struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorded) Header() http.Header         { return r.header }
func (r *recorded) WriteHeader(code int)        { r.code = code }
func (r *recorded) Write(b []byte) (int, error) { return r.body.Write(b) }

// baseRedirect puts the base path in front of a redirect that lacks it: the
// mux's, which cleans a path ("/instances/./10" → "/instances/10") on the
// path without the base — a client sent there left the dashboard (a 307
// replays a POST to it). The dashboard's own redirects carry the base.
type baseRedirect struct {
	http.ResponseWriter
	base string
}

func (w *baseRedirect) WriteHeader(code int) {
	if code >= 300 && code < 400 {
		h := w.Header()
		if loc := h.Get("Location"); strings.HasPrefix(loc, "/") && !strings.HasPrefix(loc, "//") {
			if _, ok := cutBase(loc, w.base); !ok {
				h.Set("Location", w.base+loc)
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *baseRedirect) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// refuseDrain is how long the server may spend, after refusing a request,
// draining a body the client already sent (so a small form still gets the
// answer, not a reset) before it closes the connection.
const refuseDrain = 200 * time.Millisecond

// refuse answers a request that is not served (unknown host, no valid
// credentials) without reading its body, and has the server close the
// connection afterwards: a client that announced a body and never sends it
// holds its connection for refuseDrain, not until a timeout. (net/http
// would otherwise wait for up to 256 KiB of an announced body before it
// closes.)
func refuse(w http.ResponseWriter, r *http.Request, code int, msg string) {
	if r.ContentLength != 0 {
		// Not supported by every ResponseWriter (a recorder, HTTP/2): then
		// the server's own timeouts bound it.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(refuseDrain))
	}
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Connection", "close")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(msg))
}

// hostAllowed reports whether the request names a host this dashboard
// serves: the address the client connected to, a loopback address,
// localhost, or one of Options.AllowedHosts.
func (d *dashboard) hostAllowed(r *http.Request) bool {
	if d.anyHost {
		return true
	}
	full := strings.ToLower(r.Host)
	name := full
	if h, _, err := net.SplitHostPort(full); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.Trim(name, "[]"), ".")
	switch {
	case name == "":
		return false
	case d.allowed[full] || d.allowed[name] || name == "localhost":
		return true
	}
	ip := net.ParseIP(name)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() {
		return true
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if ta, ok := local.(*net.TCPAddr); ok && ta.IP.Equal(ip) {
		return true
	}
	return false
}

type userKey struct{}

// userOf is the authenticated user of a request, for the audit log.
func userOf(r *http.Request) string {
	u, _ := r.Context().Value(userKey{}).(string)
	return u
}

// authenticate checks the request's credentials in constant time (the
// comparisons are of SHA-256 digests, so lengths leak nothing either). It
// returns the user name for the audit log.
func (d *dashboard) authenticate(r *http.Request) (string, bool) {
	if d.opts.BasicAuth == nil && d.opts.BearerToken == "" {
		return "", true
	}
	auth := r.Header.Get("Authorization")
	if d.opts.BasicAuth != nil {
		if u, p, ok := r.BasicAuth(); ok {
			uh, ph := sha256.Sum256([]byte(u)), sha256.Sum256([]byte(p))
			// Both comparisons always run: no early exit on the user name.
			if subtle.ConstantTimeCompare(uh[:], d.basicUser[:])&subtle.ConstantTimeCompare(ph[:], d.basicPass[:]) == 1 {
				return u, true
			}
		}
	}
	if d.opts.BearerToken != "" {
		if scheme, tok, ok := strings.Cut(auth, " "); ok && strings.EqualFold(scheme, "Bearer") {
			th := sha256.Sum256([]byte(strings.TrimSpace(tok)))
			if subtle.ConstantTimeCompare(th[:], d.bearer[:]) == 1 {
				return "bearer", true
			}
		}
	}
	return "", false
}

// auditWrongMethod puts a request for an action's path with another method
// than POST (a GET of /instances/5/retry: 405) on the audit trail as a
// refused action, within the refused actions' allowance (an operator probe:
// it left no line). A 405 of any other path is not an action's.
func (d *dashboard) auditWrongMethod(r *http.Request) {
	action := d.actionOf(r)
	if action == "" || !d.refuseLimit.allow(refuser(r)+" method", time.Now()) {
		return
	}
	d.auditRefused(r, action, http.StatusMethodNotAllowed, "not a POST", auditUser(r),
		"method", cut(r.Method), "path", cut(r.URL.Path), "remote", r.RemoteAddr)
}

// auditUnauthenticated puts a POST to an action's route without valid
// credentials (401) on the audit trail as a refused action, within an
// allowance per client of its own (an operator probe: it left no line; a
// wrong token left only a failed login, naming no action).
func (d *dashboard) auditUnauthenticated(r *http.Request) {
	r2 := r
	if d.base != "" {
		r2 = r.Clone(r.Context())
		r2.URL = stripBase(r.URL, d.base)
	}
	action := d.actionOf(r2)
	if action == "" || !d.refuseLimit.allow(clientOf(r)+" unauthenticated", time.Now()) {
		return
	}
	reason := "no credentials"
	if r.Header.Get("Authorization") != "" {
		reason = "credentials did not match"
	}
	d.auditRefused(r, action, http.StatusUnauthorized, reason, "(not signed in)", "path", cut(r.URL.Path), "remote", r.RemoteAddr)
}

// auditRefused writes the audit line of an action refused before its
// handler ran (mutation writes the others): the action, status, reason
// and user, then attrs, then whom a proxy named.
func (d *dashboard) auditRefused(r *http.Request, action string, status int, reason, user string, attrs ...any) {
	line := append([]any{"action", action, "outcome", "refused", "status", status, "reason", reason, "user", user}, attrs...)
	line = append(line, forwardedFor(r)...)
	d.auditor.Log(r.Context(), LevelAudit, "dashboard audit: "+action, line...)
}

// mutation wraps a POST handler: read-only mode refuses it, its form is
// parsed from a bounded body, and it leaves one audit line, whatever its
// outcome. (Cross-origin protection and the POST-only method are enforced by
// New's mux.)
func (d *dashboard) mutation(action string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &auditRecord{}
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(context.WithValue(r.Context(), auditKey{}, rec))
		defer func() { d.logAudit(r, action, rec, sw.code) }()
		orig := w // MaxBytesReader tells the server's own writer to close the connection
		w = sw
		r.Body = http.MaxBytesReader(orig, r.Body, MaxFormBytes)
		parseErr := r.ParseForm()
		// A refused bulk request's line says what it asked for, where the
		// form could be read.
		sent := func() {
			if parseErr == nil && strings.HasPrefix(action, "bulk-") {
				noteSent(r)
			}
		}
		// A line refused before its handler ran names the instance or
		// queue its path does, as the handler's own lines do (an operator
		// probe: a read-only refusal of /instances/30/retry said only
		// path=).
		target := func() {
			if v := r.PathValue("id"); v != "" {
				if id, err := strconv.ParseInt(v, 10, 64); err == nil {
					note(r, "id", id)
				} else {
					note(r, "id", cut(v))
				}
			}
			if q := r.PathValue("queue"); q != "" {
				note(r, "queue", cut(q))
			}
		}
		if d.opts.ReadOnly {
			target()
			sent()
			note(r, "refused", "read-only") // why, as a cross-origin refusal's line says (a probe)
			d.errorPage(w, r, http.StatusForbidden, "The dashboard is read-only.")
			return
		}
		if parseErr != nil {
			target()
			var tooBig *http.MaxBytesError
			if errors.As(parseErr, &tooBig) {
				d.errorPage(w, r, http.StatusRequestEntityTooLarge, "The request is too large.")
				return
			}
			// Why, on its audit line (a body that timed out said nothing).
			note(r, "refused_form", "the body could not be read", "err", cut(parseErr.Error()))
			d.errorPage(w, r, http.StatusBadRequest, "The form could not be read.")
			return
		}
		if code, msg := formShape(r, action); code != 0 {
			target()
			sent()
			note(r, "refused_form", msg, "content_type", cut(r.Header.Get("Content-Type")))
			d.errorPage(w, r, code, msg)
			return
		}
		h(w, r)
		if sw.code == http.StatusSeeOther {
			d.resetShared() // counts and pause flags changed: the next page shows it
		}
	})
}

// actionFields are the body fields each action's handler reads (a bulk
// action's: the list's filters, its page bounds refused by name).
var actionFields = map[string][]string{
	"pause": {}, "resume": {}, "retry": {}, "run-now": {},
	"cancel": {"reason"}, "cancel-tree": {"reason"},
	"signal":      {"name", "payload", "dedup_key"},
	"bulk-retry":  append([]string{"scope", "id", "reason"}, listFields...),
	"bulk-cancel": append([]string{"scope", "id", "reason"}, listFields...),
}

// formShape refuses a mutation's form that the handler would read other
// than as sent: a body that is not application/x-www-form-urlencoded (the
// form parser skips a JSON or multipart body, so its fields would be
// dropped unread, a cancel's reason among them), a field in the URL's
// query (read by no handler but a pause's or resume's queue), a field in
// the body the action does not take (actionFields), or a field given more
// than once (only the first would be read) — ticked ids excepted. It
// returns 0 for a form of the shape the dashboard's own pages send.
func formShape(r *http.Request, action string) (int, string) {
	if r.ContentLength != 0 {
		ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || ct != "application/x-www-form-urlencoded" {
			return http.StatusUnsupportedMediaType, "Send the form as application/x-www-form-urlencoded."
		}
	}
	for k := range r.URL.Query() {
		// The handlers read the body's fields: one in the URL's query would
		// be dropped unread (a bulk action's queue or limit, acting wider
		// than asked; a cancel's reason). A queue whose name a path cannot
		// carry ("." or "..", "/") is the one field that travels there (queueURL).
		if k != "queue" || action != "pause" && action != "resume" || r.PathValue("queue") != "" {
			if len(k) > 40 {
				k = k[:40]
			}
			if k == "queue" && (action == "pause" || action == "resume") {
				// The queue is in the path: "send it in the body" was no
				// way out (a hostile probe followed it to another 400).
				return http.StatusBadRequest, "The queue is named in the path already: leave it out of the URL's query."
			}
			return http.StatusBadRequest, fmt.Sprintf("The field %q is in the URL's query: send it in the form's body.", k)
		}
	}
	for k := range r.URL.Query() {
		if _, ok := r.PostForm[k]; ok {
			// In both: the handler reads one of them (a pause of
			// ?queue=default with queue=b in the body paused default).
			return http.StatusBadRequest, fmt.Sprintf("The field %q is given more than once.", k)
		}
	}
	if fields, known := actionFields[action]; known {
		for _, k := range slices.Sorted(maps.Keys(r.PostForm)) { // the first bad one, always the same
			if k == "queue" && (action == "pause" || action == "resume") {
				if r.PathValue("queue") != "" {
					return http.StatusBadRequest, "The queue is named in the path already: leave it out of the form's body."
				}
				continue // the handler says where the name goes (noQueue)
			}
			if !slices.Contains(fields, k) {
				// No handler reads it: a pause of /queues/default/pause with
				// queue=slow in the body paused default (a hostile probe).
				if len(k) > 40 {
					k = k[:40]
				}
				if len(fields) == 0 {
					return http.StatusBadRequest, fmt.Sprintf("The field %q is not one this action takes: it takes no fields.", k)
				}
				// A bulk action's page bounds are among its fields only to be
				// refused by name (parseBulk): not offered here.
				takes := slices.DeleteFunc(slices.Clone(fields), func(f string) bool { return f == "before" || f == "limit" })
				return http.StatusBadRequest, fmt.Sprintf("The field %q is not one this action takes (%s).", k, strings.Join(takes, ", "))
			}
		}
	}
	for _, vs := range []url.Values{r.PostForm, r.URL.Query()} {
		for k, v := range vs {
			if len(v) > 1 && k != "id" {
				if len(k) > 40 {
					k = k[:40]
				}
				return http.StatusBadRequest, fmt.Sprintf("The field %q is given more than once.", k)
			}
		}
	}
	return 0, ""
}

// stripBase removes the base path from u (as http.StripPrefix would), if u
// has it; a request routed here without it is left alone.
func stripBase(u *url.URL, base string) *url.URL {
	p, ok := cutBase(u.Path, base)
	if !ok {
		return u
	}
	u2 := *u
	u2.Path = p
	if u.RawPath != "" {
		if rp, ok := cutBase(u.RawPath, base); ok {
			u2.RawPath = rp
		} else {
			u2.RawPath = ""
		}
	}
	return &u2
}

func cutBase(p, base string) (string, bool) {
	if p == base {
		return "/", true
	}
	if strings.HasPrefix(p, base+"/") {
		return p[len(base):], true
	}
	return p, false
}

// hostPortProblem says what is wrong with the port of an AllowedHosts
// entry written host:port ("" if it has none, or a port 1..65535): one
// outside that range could never match a Host header.
func hostPortProblem(h string) string {
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		switch {
		case strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") && strings.Count(h, "[") == 1:
			return "" // an IPv6 address in brackets, no port
		case strings.HasPrefix(h, "[") || strings.Count(h, ":") == 1:
			return "is not a host name or host:port"
		}
		return "" // a name, or an IPv6 address without brackets or port
	}
	if host == "" {
		return "has no host name"
	}
	// Written as a Host header writes it: no sign, no leading zero (the
	// match compares text, so "08443" would never match).
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || port != strconv.Itoa(n) {
		return "has a port that is not a number from 1 to 65535"
	}
	return ""
}
