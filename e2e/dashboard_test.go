// Package e2e drives the operator dashboard in a real headless Chromium
// against a real engine and PostgreSQL. It is a module of its own so that
// the browser driver stays out of the library's dependencies.
//
// Chromium: /usr/bin/chromium (Debian's package), or E2E_CHROMIUM. Without
// it the tests skip, or fail when CI=true. Screenshots of every page go to
// E2E_ARTIFACTS (default: artifacts/ in this folder).
package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// chromiumPath finds the browser, or skips the test (fails it under CI).
func chromiumPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("E2E_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Chromium not found at %s (CI=true): install Debian's chromium package", p)
		}
		t.Skipf("Chromium not found at %s: skipping the browser tests", p)
	}
	return p
}

func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("E2E_ARTIFACTS")
	if dir == "" {
		dir = "artifacts"
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	abs, err := filepath.Abs(dir)
	require.NoError(t, err)
	return abs
}

// Order waits for signal "go" and then finishes.
type Order struct {
	Item string `json:"item"`
	Card string `json:"card"`
}

type chargeArgs struct {
	Amount int `json:"amount"`
}

// panicAmount makes the charge job panic.
const panicAmount = 666

// world is the engine, the dashboard server and the browser of a test.
type world struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	eng    *gendurable.Engine
	order  *gendurable.Machine[Order]
	charge *gendurable.Job[chargeArgs]
	fail   atomic.Bool // the charge job fails while set
	base   string      // the dashboard's URL, base path included
	ctx    context.Context
	shots  string

	mu       sync.Mutex
	problems []string // console errors, CSP violations, exceptions
	dialogs  []string // the messages of the page's confirm()s, in order
}

// lastDialog is the message of the page's last confirm().
func (w *world) lastDialog() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.dialogs) == 0 {
		return ""
	}
	return w.dialogs[len(w.dialogs)-1]
}

func setup(t *testing.T) *world {
	t.Helper()
	chrome := chromiumPath(t)
	w := &world{t: t, shots: artifactsDir(t)}
	w.fail.Store(true)

	// Database: a fresh, migrated schema, dropped at the end.
	pool, schema := dbtest.NewSchema(t, nil)
	w.pool, w.schema = pool, schema

	// Engine: an order machine that awaits a signal, and a job that fails
	// (one attempt) until the test lets it succeed.
	w.order = &gendurable.Machine[Order]{
		Name:  "order",
		Start: "reserve",
		Steps: map[string]gendurable.StepFunc[Order]{
			"reserve": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
				return r.Next("await_payment", r.State), nil
			},
			"await_payment": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
				return r.Await("ship", r.State, "paid"), nil
			},
			"ship": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
				return gendurable.Done(map[string]string{"shipped": r.State.Item}), nil
			},
		},
	}
	w.charge = &gendurable.Job[chargeArgs]{
		Name:        "charge",
		MaxAttempts: 1,
		Perform: func(ctx context.Context, j *gendurable.Run[chargeArgs]) error {
			if j.State.Amount == panicAmount {
				panic("<b>gateway</b> exploded")
			}
			if w.fail.Load() {
				return errors.New("card declined by the gateway")
			}
			return nil
		},
	}
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema:   w.schema,
		Machines: []gendurable.Definition{w.order, w.charge},
		Queues: map[string]gendurable.QueueConfig{
			"default": {PollInterval: 20 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond},
			"vip":     {PollInterval: 20 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond},
		},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	w.eng = eng
	require.NoError(t, eng.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = eng.Stop(ctx)
	})

	// Dashboard under a base path, behind basic auth, with card numbers
	// redacted.
	h, err := dashboard.New(eng, dashboard.Options{
		BasePath:  "/ops",
		BasicAuth: &dashboard.BasicAuth{User: "ops", Password: "e2e-secret"},
		Redact: func(machine string, data json.RawMessage) json.RawMessage {
			return json.RawMessage(strings.ReplaceAll(string(data), "4242-4242", "XXXX-XXXX"))
		},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	w.base = srv.URL + "/ops"

	// Browser: headless Debian Chromium with a fresh profile.
	profile := t.TempDir()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chrome),
		chromedp.UserDataDir(profile),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("mute-audio", true),
		chromedp.Flag("password-store", "basic"),
		chromedp.WindowSize(1366, 900),
	)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	tctx, cancelTimeout := context.WithTimeout(bctx, 3*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelBrowser()
		cancelAlloc() // waits for the browser to exit before TempDir removes its profile
	})
	w.ctx = tctx

	// Every request carries the credentials; every confirm() is accepted.
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:e2e-secret"))
	_, err = chromedp.Call(tctx, network.Enable, network.EnableParams{})
	require.NoError(t, err)
	_, err = chromedp.Call(tctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": auth}})
	require.NoError(t, err)
	// Every error the page logs (a CSP violation, a failed script) or
	// throws is a failure, checked at the end of the test.
	_, err = chromedp.Call(tctx, cdplog.Enable, cdp.Empty{})
	require.NoError(t, err)
	require.NoError(t, chromedp.Listen(tctx, func(ev any) {
		var p string
		switch e := ev.(type) {
		case *cdplog.EventEntryAdded:
			if e.Entry.Level == cdplog.EntryLevelError && e.Entry.Source != cdplog.EntrySourceNetwork {
				p = fmt.Sprintf("console %s: %s (%s)", e.Entry.Source, e.Entry.Text, e.Entry.URL)
			}
		case *runtime.EventExceptionThrown:
			p = "exception: " + e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil {
				p += " " + e.ExceptionDetails.Exception.Description
			}
		}
		if p != "" {
			w.mu.Lock()
			if len(w.problems) >= 20 {
				p = "" // enough to tell
			}
			if p != "" {
				w.problems = append(w.problems, p)
			}
			w.mu.Unlock()
		}
	}))
	dialogs := chromedp.Events(tctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			// A confirm() of the page's script: note it, accept it.
			w.mu.Lock()
			w.dialogs = append(w.dialogs, ev.Message)
			w.mu.Unlock()
			_, _ = chromedp.Call(tctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return w
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// run runs browser actions, failing the test on error.
func (w *world) run(steps ...chromedp.Action[chromedp.Void]) {
	w.t.Helper()
	require.NoError(w.t, chromedp.Do(w.ctx, steps...))
}

// navigate opens a dashboard path and checks the status.
func (w *world) navigate(path string, status int64) {
	w.t.Helper()
	resp, err := chromedp.Run(w.ctx, chromedp.NavigateResponse(w.base+path))
	require.NoError(w.t, err)
	require.Equal(w.t, status, resp.Status, path)
}

// submit runs an action that loads a new page (a click on a link or a
// submit button) and waits for that page.
func (w *world) submit(action chromedp.Action[chromedp.Void]) *network.Response {
	w.t.Helper()
	resp, err := chromedp.RunResponse(w.ctx, action)
	require.NoError(w.t, err)
	return resp
}

func (w *world) text(sel string) string {
	w.t.Helper()
	s, err := chromedp.Run(w.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(w.t, err, sel)
	return s
}

func (w *world) count(sel string) int {
	w.t.Helper()
	n, err := chromedp.Run(w.ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
	require.NoError(w.t, err)
	return n
}

func (w *world) location() string {
	w.t.Helper()
	u, err := chromedp.Run(w.ctx, chromedp.Location())
	require.NoError(w.t, err)
	return u
}

// screenshot saves a full-page PNG of the current page.
func (w *world) screenshot(name string) {
	w.t.Helper()
	buf, err := chromedp.Run(w.ctx, chromedp.FullScreenshot(100))
	require.NoError(w.t, err)
	p := filepath.Join(w.shots, name+".png")
	require.NoError(w.t, os.WriteFile(p, buf, 0o644))
	w.t.Logf("screenshot %s", p)
}

func (w *world) instance(id int64) *gendurable.Instance {
	w.t.Helper()
	in, err := w.eng.Instance(context.Background(), id)
	require.NoError(w.t, err)
	return in
}

func (w *world) waitStatus(id int64, want gendurable.Status) *gendurable.Instance {
	w.t.Helper()
	var in *gendurable.Instance
	require.Eventually(w.t, func() bool {
		in = w.instance(id)
		return in.Status == want
	}, 15*time.Second, 20*time.Millisecond, "instance %d never became %s", id, want)
	return in
}

func (w *world) insert(p gendurable.InsertParams) int64 {
	w.t.Helper()
	res, err := w.eng.Insert(context.Background(), p)
	require.NoError(w.t, err)
	return res.ID
}

func TestDashboardInBrowser(t *testing.T) {
	w := setup(t)
	apple := w.insert(w.order.New(Order{Item: "apple", Card: "4242-4242"}))
	banana := w.insert(w.order.New(Order{Item: "banana", Card: "4242-4242"}))
	cherry := w.insert(w.order.New(Order{Item: "cherry"}).With(gendurable.InsertOpts{Queue: "vip", PartitionKey: "customer-7"}))
	charge := w.insert(w.charge.New(chargeArgs{Amount: 1999}))
	for _, id := range []int64{apple, banana, cherry} {
		w.waitStatus(id, gendurable.StatusAwaitingSignal)
	}
	w.waitStatus(charge, gendurable.StatusFailed)

	t.Run("filter the instance list", func(t *testing.T) {
		w.t = t
		w.navigate("/instances", 200)
		require.Equal(t, 4, w.count("tr[data-instance-id]"))
		w.run(
			chromedp.SetValue(chromedp.CSS(`select[name="status"]`), "awaiting_signal"),
			chromedp.SetValue(chromedp.CSS(`input[name="machine"]`), "order"),
		)
		w.submit(chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)))
		require.Contains(t, w.location(), "status=awaiting_signal")
		require.Equal(t, 3, w.count("tr[data-instance-id]"))
		body := w.text("table.instances tbody")
		require.Contains(t, body, "awaiting_signal")
		require.NotContains(t, body, "charge")
		w.screenshot("01-instances-filtered")

		// Search by partition key: only cherry.
		w.run(chromedp.SetValue(chromedp.CSS(`input[name="q"]`), "customer-7"))
		w.submit(chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)))
		require.Equal(t, 1, w.count("tr[data-instance-id]"))
		require.Equal(t, 1, w.count(fmt.Sprintf(`tr[data-instance-id="%d"]`, cherry)))

		// A time range that ends before anything was inserted: nothing.
		w.run(chromedp.Clear(chromedp.CSS(`input[name="q"]`)))
		w.run(chromedp.SetValue(chromedp.CSS(`input[name="to"]`), "2000-01-01T00:00"))
		w.submit(chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)))
		require.Contains(t, w.location(), "to=2000-01-01T00")
		require.Equal(t, 0, w.count("tr[data-instance-id]"))
		require.Contains(t, w.text("table.instances tbody"), "No instances match")

		// Failed ones, by the status filter alone.
		w.navigate("/instances", 200)
		w.run(chromedp.SetValue(chromedp.CSS(`select[name="status"]`), "failed"))
		w.submit(chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)))
		require.Equal(t, 1, w.count("tr[data-instance-id]"))
		require.Contains(t, w.text("table.instances tbody"), "card declined by the gateway")
	})

	t.Run("open an instance", func(t *testing.T) {
		w.t = t
		w.navigate(fmt.Sprintf("/instances?machine=order&q=%d", apple), 200)
		w.submit(chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-instance-id="%d"] a`, apple))))
		require.True(t, strings.HasSuffix(w.location(), fmt.Sprintf("/ops/instances/%d", apple)), w.location())
		require.Contains(t, w.text("h1"), fmt.Sprintf("Instance %d", apple))
		require.Contains(t, w.text("p.wait"), "awaiting signal paid")
		state := w.text("#state")
		require.Contains(t, state, `"item": "apple"`)
		require.Contains(t, state, "XXXX-XXXX", "redacted")
		require.NotContains(t, state, "4242-4242")
		w.screenshot("02-instance-awaiting")
	})

	t.Run("retry a failed instance", func(t *testing.T) {
		w.t = t
		w.navigate(fmt.Sprintf("/instances/%d", charge), 200)
		require.Contains(t, w.text("h1"), "failed")
		require.Contains(t, w.text("body"), "card declined by the gateway")
		w.screenshot("03-instance-failed")
		w.fail.Store(false) // the next attempt succeeds
		w.submit(chromedp.Click(chromedp.CSS("#retry")))
		require.Contains(t, w.text(".flash"), "Retried")
		in := w.waitStatus(charge, gendurable.StatusDone)
		require.Len(t, in.Errors, 1, "the error history is kept")
		w.navigate(fmt.Sprintf("/instances/%d", charge), 200)
		require.Contains(t, w.text("h1"), "done")
		require.Equal(t, 0, w.count("#retry"))
		w.screenshot("04-instance-retried-done")
	})

	t.Run("run a scheduled instance now", func(t *testing.T) {
		w.t = t
		later := w.insert(w.charge.New(chargeArgs{Amount: 5}).With(gendurable.InsertOpts{RunIn: time.Hour})) // charges succeed since the retry
		w.navigate(fmt.Sprintf("/instances/%d", later), 200)
		require.Contains(t, w.text("h1"), "runnable")
		require.Contains(t, w.text("#attempt"), "1 of ", "attempts are shown from 1")
		w.submit(chromedp.Click(chromedp.CSS("#run-now")))
		require.Contains(t, w.text(".flash"), "Eligible now")
		w.waitStatus(later, gendurable.StatusDone)
		w.navigate(fmt.Sprintf("/instances/%d", later), 200)
		require.Equal(t, 0, w.count("#run-now"))
	})

	t.Run("a reason over the byte limit is refused in the page", func(t *testing.T) {
		// maxlength counts characters (UTF-16 units), the server bytes:
		// 1,500 CJK characters (4,500 bytes) passed the browser and got a
		// 400 (a probe). The page refuses them, before its prompt.
		w.t = t
		w.navigate(fmt.Sprintf("/instances/%d", apple), 200)
		w.mu.Lock()
		prompts := len(w.dialogs)
		w.mu.Unlock()
		msg, err := chromedp.Run(w.ctx, chromedp.Evaluate[string](`(() => {
			const f = document.getElementById("cancel").form;
			f.querySelector('input[name="reason"]').value = "中".repeat(1500);
			f.requestSubmit(document.getElementById("cancel"));
			return f.querySelector('input[name="reason"]').validationMessage;
		})()`))
		require.NoError(t, err)
		require.Contains(t, msg, "At most 4000 bytes of UTF-8: this is 4500.")
		require.True(t, strings.HasSuffix(w.location(), fmt.Sprintf("/instances/%d", apple)), w.location())
		w.mu.Lock()
		require.Equal(t, prompts, len(w.dialogs), "no prompt")
		w.mu.Unlock()
		require.False(t, w.instance(apple).Status.Terminal(), "not cancelled")
	})

	t.Run("send a signal and see it wake", func(t *testing.T) {
		w.t = t
		w.navigate(fmt.Sprintf("/instances/%d", banana), 200)
		name, err := chromedp.Run(w.ctx, chromedp.Value(chromedp.CSS(`#signal-form input[name="name"]`)))
		require.NoError(t, err)
		require.Equal(t, "paid", name, "prefilled with the awaited name")
		w.run(chromedp.SendKeys(chromedp.CSS(`#signal-form textarea[name="payload"]`), `{"txn": "T-99"}`))
		w.submit(chromedp.Click(chromedp.CSS("#send-signal")))
		require.Contains(t, w.text(".flash"), "woke the instance")
		require.NotContains(t, w.location(), "flash=", "the page script drops the flash from the URL")
		in := w.waitStatus(banana, gendurable.StatusDone)
		require.JSONEq(t, `{"shipped":"banana"}`, string(in.Result))
		var payload string
		require.NoError(t, w.pool.QueryRow(context.Background(),
			fmt.Sprintf(`SELECT payload::text FROM %s.gendurable_signals WHERE target_id = $1 AND name = 'paid'`, w.schema), banana).Scan(&payload))
		require.JSONEq(t, `{"txn":"T-99"}`, payload)

		w.navigate(fmt.Sprintf("/instances/%d", banana), 200)
		require.Contains(t, w.text("h1"), "done")
		require.Contains(t, w.text("#result"), `"shipped": "banana"`)
		require.Equal(t, 1, w.count(`tr.consumed[data-signal="paid"]`))
		require.Equal(t, 0, w.count("#signal-form"))
		w.screenshot("05-instance-signalled-done")
	})

	t.Run("queues page", func(t *testing.T) {
		w.t = t
		w.navigate("/", 200)
		require.Equal(t, 1, w.count(`tr[data-queue="default"]`))
		require.Equal(t, 1, w.count(`tr[data-queue="vip"]`))
		require.Contains(t, w.text(`tr[data-queue="vip"]`), "active")
		w.submit(chromedp.Click(chromedp.CSS(`tr[data-queue="vip"] button`)))
		require.Contains(t, w.text(".flash"), "Queue paused")
		require.Contains(t, w.text(`tr[data-queue="vip"]`), "paused")
		qs, err := w.eng.Queues(context.Background())
		require.NoError(t, err)
		for _, q := range qs {
			require.Equal(t, q.Queue == "vip", q.Paused, q.Queue)
		}
		w.screenshot("06-queues-vip-paused")
		w.submit(chromedp.Click(chromedp.CSS(`tr[data-queue="vip"] button`)))
		require.Contains(t, w.text(".flash"), "Queue resumed")
		w.screenshot("07-queues")
	})

	t.Run("machine graph", func(t *testing.T) {
		w.t = t
		w.navigate("/machines", 200)
		w.screenshot("08-machines")
		w.submit(chromedp.Click(chromedp.CSS(`tr[data-machine="order"] a`)))
		require.True(t, strings.HasSuffix(w.location(), "/ops/machines/order"), w.location())
		require.Equal(t, 1, w.count(`svg.graph g[data-step="reserve"].start`))
		require.Equal(t, 1, w.count(`svg.graph g[data-step="await_payment"]`))
		require.Equal(t, 1, w.count(`svg.graph g[data-step="ship"]`))
		require.GreaterOrEqual(t, w.count(`svg.graph path.edge`), 3) // reserve→await_payment→ship→done
		require.Contains(t, w.text(`tr[data-step-row="ship"]`), "2") // apple and cherry wait at ship
		w.screenshot("09-machine-graph")
		w.navigate("/machines/charge", 200)
		w.screenshot("10-job-graph")
	})

	t.Run("not found page", func(t *testing.T) {
		w.t = t
		w.navigate("/instances/987654321", 404)
		require.Contains(t, w.text(".error-page"), "Not found")
		w.screenshot("11-not-found")
	})

	w.t = t
	w.mu.Lock()
	defer w.mu.Unlock()
	require.Empty(t, w.problems, "the pages logged errors (CSP violations, script errors)")
}

// TestDashboardDepthInBrowser: the throughput chart, auto-refresh that
// swaps the page in place and pauses while rows are ticked, bulk retry and
// cancel (ticked rows and by filter), search by state content, and the
// detail page's timeline, unique key and collapsed panic stack trace; then
// the same pages with JavaScript off.
func TestDashboardDepthInBrowser(t *testing.T) {
	w := setup(t)
	var charges []int64
	for i := range 3 {
		charges = append(charges, w.insert(w.charge.New(chargeArgs{Amount: 100 + i})))
	}
	boom := w.insert(w.charge.New(chargeArgs{Amount: panicAmount}).With(gendurable.InsertOpts{UniqueKey: "charge-<666>"}))
	var orders []int64
	for _, item := range []string{"apple", "banana", "cherry"} {
		orders = append(orders, w.insert(w.order.New(Order{Item: item})))
	}
	for _, id := range append(charges, boom) {
		w.waitStatus(id, gendurable.StatusFailed)
	}
	for _, id := range orders {
		w.waitStatus(id, gendurable.StatusAwaitingSignal)
	}
	eval := func(expr string) bool {
		t := w.t
		t.Helper()
		v, err := chromedp.Run(w.ctx, chromedp.Evaluate[bool](expr))
		require.NoError(t, err, expr)
		return v
	}

	t.Run("throughput chart", func(t *testing.T) {
		w.t = t
		w.navigate("/", 200)
		require.Equal(t, 1, w.count("svg#throughput"))
		require.GreaterOrEqual(t, w.count("svg#throughput rect.failed"), 1, "this minute's failures")
		require.Contains(t, w.text(".chart-card h2"), "(0 done, 4 failed)")
		w.screenshot("12-queues-throughput")
	})

	t.Run("auto-refresh swaps the list in place and pauses while rows are ticked", func(t *testing.T) {
		w.t = t
		w.navigate("/instances?machine=charge&refresh=2", 200)
		require.Equal(t, 4, w.count("tr[data-instance-id]"))
		require.True(t, eval("(window.__stay = true)"))
		fresh := w.insert(w.charge.New(chargeArgs{Amount: 1}))
		require.Eventually(t, func() bool { return w.count(fmt.Sprintf(`tr[data-instance-id="%d"]`, fresh)) == 1 },
			10*time.Second, 100*time.Millisecond, "the new row never showed up")
		require.True(t, eval("window.__stay === true"), "swapped in place, not reloaded")
		require.True(t, eval(`document.documentElement.hasAttribute("data-refreshed")`))
		w.waitStatus(fresh, gendurable.StatusFailed)

		// Ticking a row pauses it: a newer instance does not appear.
		w.run(chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-instance-id="%d"] input[data-bulk]`, charges[0]))))
		later := w.insert(w.charge.New(chargeArgs{Amount: 2}))
		w.run(chromedp.Sleep(5 * time.Second)) // two refresh periods and more
		require.Equal(t, 0, w.count(fmt.Sprintf(`tr[data-instance-id="%d"]`, later)))
		require.Contains(t, w.text(".refresh-state"), "paused while rows are selected")
		require.Equal(t, "1", w.text("[data-bulk-count]"))
		w.screenshot("13-instances-refresh-paused")
		w.waitStatus(later, gendurable.StatusFailed)
	})

	t.Run("bulk retry of ticked rows", func(t *testing.T) {
		w.t = t
		w.fail.Store(false) // the retried charges succeed
		w.navigate("/instances?machine=charge&status=failed", 200)
		for _, id := range charges[:2] {
			w.run(chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-instance-id="%d"] input[data-bulk]`, id))))
		}
		require.Equal(t, "2", w.text("[data-bulk-count]"))
		w.screenshot("14-instances-ticked")
		w.submit(chromedp.Click(chromedp.CSS("#bulk-retry")))
		require.Equal(t, "Retry the 2 ticked instance(s)? Only failed ones change.", w.lastDialog())
		require.Contains(t, w.text(".flash"), "Retried 2 instance(s).")
		require.Contains(t, w.location(), "machine=charge")
		require.NotContains(t, w.location(), "flash=")
		for _, id := range charges[:2] {
			w.waitStatus(id, gendurable.StatusDone)
		}
		require.Equal(t, gendurable.StatusFailed, w.instance(charges[2]).Status, "not ticked")
	})

	t.Run("a filter's own text in its prompt", func(t *testing.T) {
		w.t = t
		// "{n}" in a filter stays as typed: only a ticked-rows prompt
		// counts (the count replaced the filter's text before).
		w.navigate("/instances?machine=order&q="+url.QueryEscape("{n}-none"), 200)
		w.submit(chromedp.Click(chromedp.CSS("#bulk-retry-match")))
		require.Contains(t, w.lastDialog(), "{n}-none")
		require.Contains(t, w.text(".flash"), "Retried 0 instance(s).")
	})

	t.Run("bulk cancel by filter", func(t *testing.T) {
		w.t = t
		w.navigate("/instances?machine=order&status=awaiting_signal", 200)
		require.Equal(t, 3, w.count("tr[data-instance-id]"))
		w.run(chromedp.SetValue(chromedp.CSS(`#bulk-form input[name="reason"]`), "closing the shop"))
		w.submit(chromedp.Click(chromedp.CSS("#bulk-cancel-match")))
		require.Contains(t, w.text(".flash"), "Cancelled 3 instance(s).")
		for _, id := range orders {
			in := w.waitStatus(id, gendurable.StatusFailed)
			require.Equal(t, "closing the shop", in.Errors[len(in.Errors)-1].Error)
		}
		require.Equal(t, 0, w.count("tr[data-instance-id]"), "none awaits any more")
		w.screenshot("15-instances-bulk-cancelled")
	})

	t.Run("search by state content", func(t *testing.T) {
		w.t = t
		// This dashboard hides data (Redact), which is asked per machine:
		// a state search names its machine.
		w.navigate("/instances?state="+url.QueryEscape(`{"item": "banana"}`), 400)
		require.Contains(t, w.text("body"), "needs a machine")
		w.navigate("/instances", 200)
		w.run(chromedp.SetValue(chromedp.CSS(`input[name="machine"]`), "order"))
		w.run(chromedp.SetValue(chromedp.CSS(`input[name="state"]`), `{"item": "banana"}`))
		w.submit(chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)))
		require.Equal(t, 1, w.count("tr[data-instance-id]"))
		require.Equal(t, 1, w.count(fmt.Sprintf(`tr[data-instance-id="%d"]`, orders[1])))
		w.screenshot("16-instances-state-search")
	})

	t.Run("detail: timeline, unique key, panic stack", func(t *testing.T) {
		w.t = t
		w.navigate(fmt.Sprintf("/instances/%d", boom), 200)
		require.Equal(t, "charge-<666>", w.text("#unique-key"))
		require.Equal(t, 1, w.count("svg#timeline"))
		require.Equal(t, 1, w.count(`svg#timeline circle[data-kind="panic"]`))
		require.Equal(t, 1, w.count(`svg#timeline circle[data-kind="failed"]`))
		require.Contains(t, w.text("td.err pre"), "panic: <b>gateway</b> exploded", "shown as text")
		require.Equal(t, 0, w.count("td.err b"), "never as markup")
		require.False(t, eval(`document.querySelector("details.stack").open`), "collapsed")
		w.run(chromedp.Click(chromedp.CSS("details.stack summary")))
		stack := w.text("details.stack pre")
		require.True(t, strings.HasPrefix(stack, "goroutine "), stack)
		require.Contains(t, stack, "dashboard_test.go")
		w.screenshot("17-instance-panic-timeline")

		// Auto-refresh keeps the opened stack open.
		w.navigate(fmt.Sprintf("/instances/%d?refresh=2", boom), 200)
		w.run(chromedp.Click(chromedp.CSS("details.stack summary")))
		require.True(t, eval("(window.__stay = true)"))
		w.run(chromedp.Sleep(2500 * time.Millisecond))
		require.Eventually(t, func() bool { return eval(`document.documentElement.hasAttribute("data-refreshed")`) },
			5*time.Second, 100*time.Millisecond)
		require.True(t, eval(`window.__stay === true && document.querySelector("details.stack").open`))
	})

	t.Run("without JavaScript", func(t *testing.T) {
		w.t = t
		_, err := chromedp.Call(w.ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
		require.NoError(t, err)
		defer func() {
			_, err := chromedp.Call(w.ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: false})
			require.NoError(t, err)
		}()
		w.navigate("/instances?machine=charge&status=failed&refresh=5", 200)
		require.Equal(t, 1, w.count(`noscript`))
		rows := w.count("tr[data-instance-id]")
		require.GreaterOrEqual(t, rows, 2)
		// The bulk form works as a plain form: no prompt, no count.
		w.run(chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-instance-id="%d"] input[data-bulk]`, charges[2]))))
		w.submit(chromedp.Click(chromedp.CSS("#bulk-retry")))
		require.Contains(t, w.text(".flash"), "Retried 1 instance(s).")
		w.waitStatus(charges[2], gendurable.StatusDone)
		w.screenshot("18-instances-no-javascript")
	})

	w.t = t
	w.mu.Lock()
	defer w.mu.Unlock()
	require.Empty(t, w.problems, "the pages logged errors (CSP violations, script errors)")
}
