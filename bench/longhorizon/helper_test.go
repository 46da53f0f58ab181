package longhorizon

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The test binary doubles as a fake adapter (LH_FAKE_ADAPTER=1): a tiny job
// queue in one table, fake_jobs, that speaks the adapter protocol as the
// real adapters do (BENCH_INSTANCE_ID, PRODUCER_RATE_CONTROL_FILE re-read
// every second, observer metrics from instance 0 only), so the driver's
// tests need neither gendurable's nor River's adapter.
func TestMain(m *testing.M) {
	if os.Getenv("LH_FAKE_ADAPTER") == "1" {
		os.Exit(fakeAdapter())
	}
	os.Exit(m.Run())
}

// fakeCounter counts fake_jobs rows the way DefaultCounters count the real
// systems' tables.
var fakeCounter = Counter{Table: "fake_jobs",
	SQL: `SELECT count(*) FILTER (WHERE status = 'ready'), 0 FROM %s WHERE inserted_at < $1`}

// fakeCommand is the argv that runs this test binary as a fake adapter
// reporting system name (env execs, so the adapter is the process itself).
func fakeCommand(name string) []string {
	return []string{"env", "LH_FAKE_ADAPTER=1", "FAKE_SYSTEM=" + name, os.Args[0], "-test.run=^$"}
}

// maintURL is the test's maintenance connection: the server of
// GENDURABLE_TEST_DATABASE_URL, else DATABASE_URL's (as every test's, the
// README's Tests section), database postgres. It read DATABASE_URL only,
// and made and dropped its lhtest_* databases on the default server when
// only the documented variable was set (a newcomer's probe).
func maintURL(t *testing.T) string {
	t.Helper()
	base := os.Getenv("GENDURABLE_TEST_DATABASE_URL")
	if base == "" {
		base = os.Getenv("DATABASE_URL")
	}
	if base == "" {
		base = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres"
	return u.String()
}

func envFloat(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil {
		return v
	}
	return def
}

func fakeAdapter() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	system := os.Getenv("FAKE_SYSTEM")
	rate := envFloat("PRODUCER_RATE", 10)
	instance := int(envFloat("BENCH_INSTANCE_ID", 0))
	rateFile := os.Getenv("PRODUCER_RATE_CONTROL_FILE")
	workers := int(envFloat("WORKER_COUNT", 2))
	every := time.Duration(envFloat("SAMPLE_EVERY_S", 5)) * time.Second
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake:", err)
		return 1
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS fake_jobs (id bigserial PRIMARY KEY,
		status text NOT NULL DEFAULT 'ready', inserted_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		fmt.Fprintln(os.Stderr, "fake:", err)
		return 1
	}
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(map[string]any{"kind": "descriptor", "system": system, "event_tables": []string{"public.fake_jobs"},
		"extensions": []string{}, "version": "test", "schema_version": 1, "db_name": "x", "started_at": time.Now().UTC()})

	var mu sync.Mutex
	var lat []float64
	var enq, done int
	var wg sync.WaitGroup
	wg.Go(func() { // producer
		owed := 0.0
		for tick := time.NewTicker(50 * time.Millisecond); ; {
			select {
			case <-ctx.Done():
				tick.Stop()
				return
			case <-tick.C:
			}
			if b, err := os.ReadFile(rateFile); err == nil { // every tick: the real adapters, every second
				if r, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64); err == nil {
					mu.Lock()
					rate = r
					mu.Unlock()
				}
			}
			mu.Lock()
			owed += rate / 20
			mu.Unlock()
			n := int(owed)
			owed -= float64(n)
			if n > 0 {
				if _, err := pool.Exec(ctx, `INSERT INTO fake_jobs (status) SELECT 'ready' FROM generate_series(1, $1)`, n); err == nil {
					mu.Lock()
					enq += n
					mu.Unlock()
				}
			}
		}
	})
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				var ms float64
				err := pool.QueryRow(ctx, `UPDATE fake_jobs SET status = 'done' WHERE id = (SELECT id FROM fake_jobs
					WHERE status = 'ready' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
					RETURNING extract(epoch FROM clock_timestamp() - inserted_at) * 1000`).Scan(&ms)
				if err != nil {
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
					continue
				}
				mu.Lock()
				lat = append(lat, ms)
				done++
				mu.Unlock()
			}
		})
	}
	for {
		next := time.Now().Truncate(every).Add(every)
		select {
		case <-ctx.Done():
			wg.Wait()
			return 0
		case <-time.After(time.Until(next)):
		}
		var depth float64
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM fake_jobs WHERE status = 'ready'`).Scan(&depth)
		mu.Lock()
		sort.Float64s(lat)
		pct := func(q float64) float64 {
			if len(lat) == 0 {
				return 0
			}
			return lat[min(int(math.Ceil(q*float64(len(lat))))-1, len(lat)-1)]
		}
		vals := map[string]float64{MetricClaimP50: pct(0.5), MetricClaimP95: pct(0.95), MetricClaimP99: pct(0.99),
			MetricEnqueue: float64(enq) / every.Seconds(), MetricCompletion: float64(done) / every.Seconds(), MetricDepth: depth,
			MetricTargetRate: rate}
		lat, enq, done = lat[:0], 0, 0
		mu.Unlock()
		metrics := []string{MetricClaimP50, MetricClaimP95, MetricClaimP99, MetricEnqueue, MetricCompletion}
		if instance == 0 { // the observer metrics, as the real adapters
			metrics = append(metrics, MetricDepth, MetricTargetRate)
		}
		for _, m := range metrics {
			_ = out.Encode(map[string]any{"t": next.Unix(), "system": system, "kind": "adapter", "subject_kind": "adapter",
				"subject": "", "metric": m, "value": vals[m], "window_s": every.Seconds()})
		}
	}
}
