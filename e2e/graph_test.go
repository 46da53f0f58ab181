package e2e

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// pipelineState moves a 12-step pipeline along.
type pipelineState struct {
	N int `json:"n"`
}

// pipeline is a 12-step machine that declares its Flow: each stage leads
// to the next, "check" may also go back to "fetch", the last one finishes.
func pipeline() *gendurable.Machine[pipelineState] {
	stages := []string{"fetch", "parse", "check", "enrich", "score", "rank", "dedupe", "store", "index", "notify", "audit", "archive"}
	m := &gendurable.Machine[pipelineState]{Name: "pipeline", Start: stages[0], Steps: map[string]gendurable.StepFunc[pipelineState]{}}
	for i, s := range stages {
		fs := gendurable.FlowStep{Step: s}
		if i+1 < len(stages) {
			next := stages[i+1]
			fs.To = []string{next}
			m.Steps[s] = func(ctx context.Context, r *gendurable.Run[pipelineState]) (gendurable.Outcome, error) {
				if s == "notify" && r.State.N == 2 {
					return r.Await(next, r.State, "ack"), nil // parks at audit
				}
				return r.Next(next, r.State), nil
			}
		} else {
			m.Steps[s] = func(ctx context.Context, r *gendurable.Run[pipelineState]) (gendurable.Outcome, error) {
				return gendurable.Done(nil), nil
			}
		}
		if s == "check" {
			fs.To = append(fs.To, "fetch")
		}
		m.Flow = append(m.Flow, fs)
	}
	return m
}

// TestStandaloneGraphInBrowser: `gendurable ui`'s situation — a dashboard
// whose engine registers no machine — draws a 12-step machine whole from
// the definitions a worker stored, within a 1400 px window.
func TestStandaloneGraphInBrowser(t *testing.T) {
	w := setup(t)
	ctx := context.Background()

	// A worker runs the pipeline, then stops (merging what its steps did).
	p := pipeline()
	worker, err := gendurable.New(w.pool, &gendurable.Config{Schema: w.schema, Machines: []gendurable.Definition{p},
		Queues: map[string]gendurable.QueueConfig{"pipeline": {PollInterval: 20 * time.Millisecond}},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	require.NoError(t, worker.Start(ctx))
	var ids []int64
	for n := range 3 {
		res, err := worker.Insert(ctx, p.New(pipelineState{N: n}).With(gendurable.InsertOpts{Queue: "pipeline"}))
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	for i, id := range ids {
		want := gendurable.StatusDone
		if i == 2 {
			want = gendurable.StatusAwaitingSignal
		}
		require.Eventually(t, func() bool {
			in, err := worker.Instance(ctx, id)
			return err == nil && in.Status == want
		}, 15*time.Second, 20*time.Millisecond)
	}
	require.NoError(t, worker.Stop(ctx))

	// The standalone dashboard: an engine with no machine, as `gendurable ui`.
	bare, err := gendurable.New(w.pool, &gendurable.Config{Schema: w.schema})
	require.NoError(t, err)
	h, err := dashboard.New(bare, dashboard.Options{BasePath: "/ui",
		BasicAuth: &dashboard.BasicAuth{User: "ops", Password: "e2e-secret"},
		Logger:    slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ui/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	w.base = srv.URL + "/ui"

	w.run(chromedp.EmulateViewport(1400, 900))
	w.navigate("/machines", 200)
	require.Equal(t, 1, w.count(`tr[data-machine="pipeline"]`))
	require.Equal(t, 1, w.count(`tr[data-machine="order"]`), "the e2e worker's machines too")
	w.screenshot("12-standalone-machines")
	w.submit(chromedp.Click(chromedp.CSS(`tr[data-machine="pipeline"] a`)))
	require.Equal(t, 12, w.count(`svg.graph g.node:not(.terminal)`), "every step, without a worker")
	require.Equal(t, 1, w.count(`svg.graph g[data-step="fetch"].start`))
	require.Equal(t, 12, w.count(`svg.graph path.edge:not(.declared-only)`), "11 nexts and archive → done, taken")
	require.Equal(t, 1, w.count(`svg.graph path.edge.declared-only`), "check → fetch: declared, never taken")
	audit, err := chromedp.Run(w.ctx, chromedp.Evaluate[string](`document.querySelector('svg.graph g[data-step="audit"]').textContent`))
	require.NoError(t, err)
	require.Contains(t, audit, "awaiting_signal 1", "parked at the step it waits at")
	// No horizontal overflow at 1400 px: the drawing fits its card and the page.
	fits, err := chromedp.Run(w.ctx, chromedp.Evaluate[bool](`(() => {
		const svg = document.querySelector('svg.graph').getBoundingClientRect();
		const card = document.querySelector('.graph-wrap').getBoundingClientRect();
		return svg.right <= card.right + 0.5 && document.documentElement.scrollWidth <= window.innerWidth;
	})()`))
	require.NoError(t, err)
	require.True(t, fits, "the graph overflows a 1400 px window")
	order, err := chromedp.Run(w.ctx, chromedp.Evaluate[string](
		`[...document.querySelectorAll('tr[data-step-row]')].map(r => r.dataset.stepRow).join(',')`))
	require.NoError(t, err)
	require.Equal(t, "fetch,parse,check,enrich,score,rank,dedupe,store,index,notify,audit,archive", order, "declaration order")
	w.screenshot("13-standalone-graph-12-steps")
	// The graph card alone: the README's picture (docs/img/dashboard-graph.png).
	card, err := chromedp.Run(w.ctx, chromedp.Screenshot(chromedp.CSS(`.graph-card`)))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(w.shots, "14-standalone-graph-card.png"), card, 0o644))

	w.mu.Lock()
	defer w.mu.Unlock()
	require.Empty(t, w.problems, "the pages logged errors (CSP violations, script errors)")
}
