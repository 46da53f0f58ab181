package dashboard_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestQueuesPageSharesItsCounts: the queues page counts every instance by
// queue and status — an aggregate over the whole table (130 ms at 200,000
// rows on two cores; linear in the table), which every request ran anew,
// so a few tabs at ?refresh=2, or a client hammering the page, kept the
// database scanning the table without pause (30 requests at once: 30
// aggregates). The counts are now shared between requests for 2 s; an
// action of the dashboard makes the next page read afresh, so a pause
// shows at once.
func TestQueuesPageSharesItsCounts(t *testing.T) {
	t.Parallel()
	tr := &dbtest.CountTracer{Marker: "FULL JOIN"} // the queue counts' statement, and no other the page runs
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 6, Tracer: tr})
	order := orderMachine()
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{order},
		Queues: map[string]gendurable.QueueConfig{"default": {}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = eng.Insert(context.Background(), order.New(Order{Item: "x"}))
	require.NoError(t, err)
	h, err := dashboard.New(eng, dashboard.Options{AllowedHosts: []string{"example.com"}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)

	var wg sync.WaitGroup
	for range 30 {
		wg.Go(func() {
			r := get(t, h, "/")
			require.Equal(t, http.StatusOK, r.code, r.body)
		})
	}
	wg.Wait()
	require.LessOrEqual(t, tr.N.Load(), int64(2), "30 loads of the queues page at once share their counts")

	r := post(t, h, "/queues/default/pause", nil)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	r = get(t, h, "/")
	require.Contains(t, r.body, "Resume", "the pause shows on the next page at once")
	require.Contains(t, r.body, "paused")
}

// TestGraphPagesShareTheirCounts: a machine's graph counts its instances by
// step and status — a sequential scan of the table (129 ms at 200,000
// rows) — and 20 loads of the graph at once ran 20 scans. A known
// machine's graph is now shared for 2 s.
func TestGraphPagesShareTheirCounts(t *testing.T) {
	t.Parallel()
	tr := &dbtest.CountTracer{Marker: "count(*) FILTER"} // the graph's step counts
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 6, Tracer: tr})
	order := orderMachine()
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{order},
		Queues: map[string]gendurable.QueueConfig{"default": {}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	h, err := dashboard.New(eng, dashboard.Options{AllowedHosts: []string{"example.com"}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)

	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			r := get(t, h, "/machines/order")
			require.Equal(t, http.StatusOK, r.code, r.body)
			require.Contains(t, r.body, `data-step="wait"`)
		})
	}
	wg.Wait()
	require.LessOrEqual(t, tr.N.Load(), int64(2), "20 loads of a graph at once share its counts")
}

// machineListTracer counts the statements that list the stored machines
// (Engine.ListMachines: the stored definitions of every machine, no name),
// the read behind the machine names the dashboard knows.
type machineListTracer struct{ n atomic.Int64 }

func (c *machineListTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "gendurable_machines") && strings.Contains(d.SQL, "ORDER BY name, version") && len(d.Args) > 0 {
		if name, ok := d.Args[0].(*string); ok && name == nil {
			c.n.Add(1)
		}
	}
	return ctx
}

func (c *machineListTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestMachineNamesAreReadOncePerRequestAndShared: the names of the machines
// the dashboard knows (a read of every stored definition) were read anew by
// every graph page (20 loads of a graph at once: 20 reads), and twice by a
// list filtered on state without a machine under Options.Redact (once to
// check the filter, once for the form). A request now reads them once at
// most, and requests share them for 2 s, like the queues page's counts.
func TestMachineNamesAreReadOncePerRequestAndShared(t *testing.T) {
	t.Parallel()
	tr := &machineListTracer{}
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 6, Tracer: tr})
	order := orderMachine()
	eng, err := gendurable.New(pool, &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{order},
		Queues: map[string]gendurable.QueueConfig{"default": {}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = eng.Insert(context.Background(), order.New(Order{Item: "x"}))
	require.NoError(t, err)
	newHandler := func() http.Handler {
		h, err := dashboard.New(eng, dashboard.Options{AllowedHosts: []string{"example.com"}, Logger: slog.New(slog.DiscardHandler),
			Redact: func(_ string, data json.RawMessage) json.RawMessage { return data }}) // hides nothing: every filter passes
		require.NoError(t, err)
		return h
	}

	r := get(t, newHandler(), "/instances?machine=order&state="+url.QueryEscape(`{"item":"x"}`))
	require.Equal(t, http.StatusOK, r.code, r.body)
	require.Len(t, rowIDs(r.body), 1)
	require.Equal(t, int64(1), tr.n.Load(), "a list filtered on state reads the machine names once")

	tr.n.Store(0)
	h := newHandler()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			r := get(t, h, "/machines/order")
			require.Equal(t, http.StatusOK, r.code, r.body)
			require.Contains(t, r.body, `data-step="wait"`)
		})
	}
	wg.Wait()
	require.LessOrEqual(t, tr.n.Load(), int64(2), "20 loads of a graph at once share the machine names")
}
