package dashboard

import (
	"net/http"
	"net/url"
	"strconv"
)

// Auto-refresh: a list or detail page asked with ?refresh=N (N seconds,
// within minRefresh..maxRefresh) reloads itself every N seconds. With
// JavaScript, app.js fetches the page and swaps its <main> in place (no
// flicker, scroll kept), and skips a turn while the reader is busy: typing
// in a form, with rows ticked for a bulk action, text selected, or the tab
// hidden. Without JavaScript, a <noscript> meta refresh reloads the page.
// The links that turn it on, change it or stop it keep the page's filters.

const (
	minRefresh = 2
	maxRefresh = 300
)

// refreshChoices are the periods the page offers (seconds).
var refreshChoices = []int{5, 15, 60}

// refreshLinks is what the page shows of auto-refresh.
type refreshLinks struct {
	Every   int // seconds; 0: off
	OffURL  string
	Choices []refreshChoice
}

type refreshChoice struct {
	Label  string
	URL    string
	Active bool
}

// refreshLinks reads ?refresh= (an unparsable or out-of-range value is
// clamped or ignored: it only changes how often the page reloads) and
// builds the links to the same page with other periods.
func (d *dashboard) refreshLinks(r *http.Request) refreshLinks {
	q := r.URL.Query()
	var rl refreshLinks
	if n, err := strconv.Atoi(q.Get("refresh")); err == nil && n > 0 {
		rl.Every = min(max(n, minRefresh), maxRefresh)
	}
	for _, k := range flashParams {
		q.Del(k)
	}
	with := func(n int) string {
		v := url.Values{}
		for k, vs := range q {
			v[k] = vs
		}
		v.Del("refresh")
		if n > 0 {
			v.Set("refresh", strconv.Itoa(n))
		}
		u := d.link(r.URL.Path)
		if e := v.Encode(); e != "" {
			u += "?" + e
		}
		return u
	}
	rl.OffURL = with(0)
	for _, n := range refreshChoices {
		rl.Choices = append(rl.Choices, refreshChoice{Label: strconv.Itoa(n) + "s", URL: with(n), Active: n == rl.Every})
	}
	return rl
}
