package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/syncbuf"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Order is the state of the test machine: it waits for signal "go", then
// finishes with a result that repeats its secret.
type Order struct {
	Item   string `json:"item"`
	Secret string `json:"secret,omitempty"`
}

func orderMachine() *gendurable.Machine[Order] {
	return &gendurable.Machine[Order]{
		Name:  "order",
		Start: "wait",
		Steps: map[string]gendurable.StepFunc[Order]{
			"wait": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
				return r.Await("ship", r.State, "go"), nil
			},
			"ship": func(ctx context.Context, r *gendurable.Run[Order]) (gendurable.Outcome, error) {
				return gendurable.Done(map[string]string{"shipped": r.State.Item, "secret": r.State.Secret}), nil
			},
		},
	}
}

type flakyArgs struct {
	N int `json:"n"`
}

// flakyJob fails on every attempt with an error text that must not leak
// into anything but the error history.
func flakyJob() *gendurable.Job[flakyArgs] {
	return &gendurable.Job[flakyArgs]{
		Name:        "flaky",
		MaxAttempts: 1,
		Perform: func(ctx context.Context, j *gendurable.Run[flakyArgs]) error {
			return fmt.Errorf("boom %d", j.State.N)
		},
	}
}

// env is one test's world: a fresh schema, a pool, an engine.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	eng    *gendurable.Engine
	logs   *syncbuf.Buffer
	order  *gendurable.Machine[Order]
	flaky  *gendurable.Job[flakyArgs]
	batch  *gendurable.Machine[Batch]
}

// Batch fans out one order per item and finishes when they all have.
type Batch struct {
	Items []string `json:"items"`
}

func batchMachine(order *gendurable.Machine[Order]) *gendurable.Machine[Batch] {
	return &gendurable.Machine[Batch]{
		Name:  "batch",
		Start: "fan",
		Steps: map[string]gendurable.StepFunc[Batch]{
			"fan": func(ctx context.Context, r *gendurable.Run[Batch]) (gendurable.Outcome, error) {
				var kids []gendurable.InsertParams
				for _, it := range r.State.Items {
					kids = append(kids, order.New(Order{Item: it}))
				}
				return r.ScheduleChildren("join", r.State, kids...), nil
			},
			"join": func(ctx context.Context, r *gendurable.Run[Batch]) (gendurable.Outcome, error) {
				return gendurable.Done(len(r.Children)), nil
			},
		},
	}
}

// newEnv creates a migrated schema and its pool (internal/dbtest: dropped
// and closed at cleanup, within the package's connection budget) and an
// engine (not started) that knows the order machine and the flaky job.
func newEnv(t *testing.T) *env {
	t.Helper()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 6})
	logs := &syncbuf.Buffer{}
	order, flaky := orderMachine(), flakyJob()
	batch := batchMachine(order)
	eng, err := gendurable.New(pool, &gendurable.Config{
		Schema:   schema,
		Machines: []gendurable.Definition{order, flaky, batch},
		Queues: map[string]gendurable.QueueConfig{
			"default": {Concurrency: 4, PollInterval: 20 * time.Millisecond, MaxPollInterval: 50 * time.Millisecond},
		},
		LeaseDuration:     3 * time.Second,
		HeartbeatInterval: time.Second,
		ReaperInterval:    200 * time.Millisecond,
		DrainTimeout:      5 * time.Second,
		Logger:            slog.New(slog.NewTextHandler(logs, nil)),
	})
	require.NoError(t, err)
	return &env{t: t, pool: pool, schema: schema, eng: eng, logs: logs, order: order, flaky: flaky, batch: batch}
}

// start works the queues until the test ends.
func (e *env) start() {
	e.t.Helper()
	require.NoError(e.t, e.eng.Start(context.Background()))
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = e.eng.Stop(ctx)
	})
}

// handler builds a dashboard on the env's engine; its logs go to buf.
func (e *env) handler(opts dashboard.Options) (http.Handler, *syncbuf.Buffer) {
	e.t.Helper()
	buf := &syncbuf.Buffer{}
	if opts.AllowedHosts == nil {
		opts.AllowedHosts = []string{"example.com"} // the Host of every in-memory request
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	h, err := dashboard.New(e.eng, opts)
	require.NoError(e.t, err)
	return h, buf
}

func (e *env) insertOrder(o Order, opts ...gendurable.InsertOpts) int64 {
	e.t.Helper()
	p := e.order.New(o)
	if len(opts) > 0 {
		p = p.With(opts[0])
	}
	res, err := e.eng.Insert(context.Background(), p)
	require.NoError(e.t, err)
	return res.ID
}

// failed inserts an order and cancels it: a failed instance, without a worker.
func (e *env) failed() int64 {
	e.t.Helper()
	id := e.insertOrder(Order{Item: "x"})
	require.NoError(e.t, e.eng.Cancel(context.Background(), id, "made failed by the test"))
	return id
}

func (e *env) instance(id int64) *gendurable.Instance {
	e.t.Helper()
	in, err := e.eng.Instance(context.Background(), id)
	require.NoError(e.t, err)
	return in
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), strings.ReplaceAll(sql, "{{s}}", e.schema), args...).Scan(&n))
	return n
}

func (e *env) queuePaused(queue string) bool {
	e.t.Helper()
	qs, err := e.eng.Queues(context.Background())
	require.NoError(e.t, err)
	for _, q := range qs {
		if q.Queue == queue {
			return q.Paused
		}
	}
	return false
}

func (e *env) waitStatus(id int64, want gendurable.Status, timeout time.Duration) *gendurable.Instance {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		in := e.instance(id)
		if in.Status == want {
			return in
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("instance %d is %s at %s after %s, want %s", id, in.Status, in.Step, timeout, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// req is one request to a handler.
type req struct {
	method string
	path   string
	form   url.Values
	raw    string // the body when form is nil (its Content-Type in header)
	header map[string]string
	host   string   // default example.com
	remote string   // default httptest's 192.0.2.1:1234
	local  net.Addr // the address the client connected to, if any
}

type resp struct {
	code   int
	header http.Header
	body   string
}

// do serves r with h in memory. The request's Host is example.com; a POST
// is a same-origin browser form submission unless headers say otherwise.
func do(t *testing.T, h http.Handler, r req) resp {
	t.Helper()
	var body io.Reader
	if r.form != nil {
		body = strings.NewReader(r.form.Encode())
	} else if r.raw != "" {
		body = strings.NewReader(r.raw)
	}
	hr := httptest.NewRequest(r.method, "http://example.com"+r.path, body)
	if r.form != nil {
		hr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	if r.host != "" {
		hr.Host = r.host
	}
	if r.remote != "" {
		hr.RemoteAddr = r.remote
	}
	if r.local != nil {
		hr = hr.WithContext(context.WithValue(hr.Context(), http.LocalAddrContextKey, r.local))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, hr)
	return resp{code: rec.Code, header: rec.Header(), body: rec.Body.String()}
}

func get(t *testing.T, h http.Handler, path string) resp {
	t.Helper()
	return do(t, h, req{method: http.MethodGet, path: path})
}

func post(t *testing.T, h http.Handler, path string, form url.Values) resp {
	t.Helper()
	if form == nil {
		form = url.Values{}
	}
	return do(t, h, req{method: http.MethodPost, path: path, form: form,
		header: map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://example.com"}})
}

// rowIDs are the instance ids a list page shows.
func rowIDs(body string) []string {
	var ids []string
	for _, part := range strings.Split(body, `data-instance-id="`)[1:] {
		id, _, _ := strings.Cut(part, `"`)
		ids = append(ids, id)
	}
	return ids
}

// nextLink is the list page's "Older" link (unescaped), or "".
func nextLink(body string) string {
	_, rest, ok := strings.Cut(body, `rel="next" href="`)
	if !ok {
		return ""
	}
	href, _, _ := strings.Cut(rest, `"`)
	return strings.ReplaceAll(href, "&amp;", "&")
}

// flashLocation checks that r redirects to path with the flash key flash,
// signed (the page shows it only so), and returns the Location to get.
func flashLocation(t *testing.T, r resp, path, flash string) string {
	t.Helper()
	loc := r.header.Get("Location")
	u, err := url.Parse(loc)
	require.NoError(t, err)
	require.Equal(t, path, u.Path, loc)
	require.Equal(t, flash, u.Query().Get("flash"), loc)
	require.NotEmpty(t, u.Query().Get("sig"), "%s: unsigned", loc)
	return loc
}
