package dashboard

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/display"
)

//go:embed templates/*.html static/*
var assets embed.FS

// pages maps a page name to its template (the layout plus the page).
type pages map[string]*template.Template

var pageNames = []string{"queues", "instances", "instance", "machines", "graph", "error"}

func parsePages(d *dashboard) (pages, error) {
	funcs := template.FuncMap{
		"link":        d.link,
		"instanceURL": func(id int64) string { return d.link("/instances/" + strconv.FormatInt(id, 10)) },
		"machineURL": func(name string) string {
			if !pathCarries("/machines/" + name) { // as queueURL
				return d.link("/machines") + "?" + url.Values{"name": {name}}.Encode()
			}
			return d.link("/machines/" + url.PathEscape(name))
		},
		"queueURL": func(queue, action string) string {
			if !pathCarries("/queues/" + queue + "/" + action) {
				// A name a path cannot carry travels in the query instead.
				return d.link("/queues/"+action) + "?" + url.Values{"queue": {queue}}.Encode()
			}
			return d.link("/queues/" + url.PathEscape(queue) + "/" + action)
		},
		"listURL":  d.listURL,
		"asset":    func(name string) string { return d.link("/static/" + name + "?v=" + assetVersion) },
		"time":     fmtTime,
		"timep":    func(t *time.Time) string { return fmtTimePtr(t) },
		"ago":      ago,
		"agop":     func(t *time.Time) string { return agoPtr(t) },
		"statuses": func() []gendurable.Status { return allStatuses },
		"count":    func(m map[gendurable.Status]int64, s gendurable.Status) int64 { return m[s] },
		"join":     strings.Join,
		"live":     func(s gendurable.Status) bool { return !s.Terminal() },
		"trunc":    truncate,
		"add":      func(a, b int) int { return a + b },
		"attempt":  display.Attempt, // counted from 1, as the CLI shows it
		"run":      display.Run,
		"maxTP":    func() int { return gendurable.MaxThroughputRows },
	}
	out := pages{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

var allStatuses = []gendurable.Status{
	gendurable.StatusRunnable, gendurable.StatusExecuting, gendurable.StatusAwaitingSignal,
	gendurable.StatusAwaitingChildren, gendurable.StatusDone, gendurable.StatusFailed,
}

// link is path (which starts with "/") under the base path.
func (d *dashboard) link(path string) string {
	if d.base == "" {
		return path
	}
	if path == "/" {
		return d.base + "/"
	}
	return d.base + path
}

// listURL links to the instance list with filters given as key, value
// pairs; empty values are left out.
func (d *dashboard) listURL(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			v.Set(kv[i], kv[i+1])
		}
	}
	if len(v) == 0 {
		return d.link("/instances")
	}
	return d.link("/instances") + "?" + v.Encode()
}

// view is what every page template gets.
type view struct {
	Title    string
	AppTitle string
	Nav      string
	ReadOnly bool
	Flash    string
	User     string
	Now      time.Time
	Refresh  refreshLinks
	Data     any
}

// render executes page into a buffer (so a template error cannot leave half
// a page) and writes it with code.
func (d *dashboard) render(w http.ResponseWriter, r *http.Request, code int, page, title, nav string, data any) {
	v := view{Title: title, AppTitle: d.opts.Title, Nav: nav, ReadOnly: d.opts.ReadOnly, User: userOf(r), Now: time.Now(), Data: data}
	if code < 300 {
		v.Flash = d.flashOf(r)
		v.Refresh = d.refreshLinks(r)
	}
	var buf bytes.Buffer
	if err := d.pages[page].Execute(&buf, v); err != nil {
		ref := newRef()
		d.log.Error("dashboard: render", "ref", ref, "page", page, "err", err)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte("internal error (reference " + ref + ")\n"))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		// html/template escapes markup but not bidirectional controls: a
		// state, payload, error message or cancel reason holding U+202E
		// would show the text after it reversed. The templates hold none,
		// so only data is changed, and only where it carries one.
		_, _ = w.Write(display.Page(buf.Bytes()))
	}
}

// prettyJSON redacts and indents a JSON document for display.
func (d *dashboard) prettyJSON(machine string, raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	if d.opts.Redact != nil {
		raw = d.opts.Redact(machine, raw)
		if len(raw) == 0 {
			return ""
		}
	}
	// Indented only if that does not multiply it (display.Indent): 20
	// signals of 2 KB nested 1,000 levels deep made a 40 MB page
	// (TestDetailPageDoesNotIndentDeepValues).
	out, _ := display.Indent(raw)
	return string(out)
}

const timeLayout = "2006-01-02 15:04:05Z"

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(timeLayout)
}

func fmtTimePtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return fmtTime(*t)
}

// ago says how long ago (or, for a future time, in how long) t is.
func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	now := time.Now()
	// Whole years, from the calendar: durations saturate at 292 years (a
	// row due in 9999 showed "just now", its negated duration
	// overflowing).
	if t.After(now) {
		if y := wholeYears(now, t); y >= 2 {
			return strconv.Itoa(y) + "y from now"
		}
	} else if y := wholeYears(t, now); y >= 2 {
		return strconv.Itoa(y) + "y ago"
	}
	d := now.Sub(t)
	suffix := " ago"
	if d < 0 {
		d, suffix = -d, " from now"
	}
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s" + suffix
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m" + suffix
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h" + suffix
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d" + suffix
}

// wholeYears is how many whole years from a to b (a not after b).
func wholeYears(a, b time.Time) int {
	y := b.Year() - a.Year()
	if a.AddDate(y, 0, 0).After(b) {
		y--
	}
	return y
}

func agoPtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return ago(*t)
}

func truncate(n int, s string) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary.
	i := n
	for i > 0 && !utf8RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// Static assets: served from the embedded FS with an ETag; links carry a
// version so that a new build is fetched at once.
var (
	staticFiles  = map[string][]byte{}
	assetVersion string
)

func init() {
	sum := sha256.New()
	entries, err := fs.ReadDir(assets, "static")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		b, err := fs.ReadFile(assets, "static/"+e.Name())
		if err != nil {
			panic(err)
		}
		staticFiles[e.Name()] = b
		sum.Write(b)
	}
	assetVersion = hex.EncodeToString(sum.Sum(nil))[:12]
}

var staticTypes = map[string]string{".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}

// serveStatic answers a static asset by its name and reports whether it
// has one by that name (the caller answers the 404).
func serveStatic(w http.ResponseWriter, r *http.Request) bool {
	name := r.PathValue("file")
	b, ok := staticFiles[name]
	if !ok {
		return false
	}
	ext := name[strings.LastIndexByte(name, '.'):]
	w.Header().Set("Content-Type", staticTypes[ext])
	w.Header().Set("Cache-Control", "private, max-age=3600")
	w.Header().Set("ETag", `"`+assetVersion+`"`)
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
	return true
}

// pathCarries reports whether a page's path p, a name unescaped in it, reaches
// its handler as it is. A browser resolves a dot segment away, escaped or not
// ("." and ".."), and the server's router answers a path that is not clean
// (an empty segment: a queue named "/" is "/queues///pause" unescaped) with a
// redirect to the cleaned one, which a form's POST does not follow: such
// names travel in the query (/queues/pause?queue=…, /machines?name=…).
func pathCarries(p string) bool {
	return path.Clean(p) == p
}
