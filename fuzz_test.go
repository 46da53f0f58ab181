// Bad-input fuzzing (reliability scenario 8, see RELIABILITY.md): insert and
// signal options and payloads, and schema names. Whatever the input, the
// engine must answer with a typed error (one of the package's sentinels) or
// succeed, never panic, and write nothing when it rejects. The seed corpus
// lives in testdata/fuzz/<FuzzName>/ and runs with every `go test`;
//
//	go test -run '^$' -fuzz '^FuzzInsertInput$' -fuzztime 60s .
//
// explores further (one target per run).

package gendurable_test

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/migrate"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fzState is a state that can hold anything, deeply nested values included.
type fzState struct {
	V any `json:"v"`
}

func fzNested(depth int) any {
	var v any = "leaf"
	for i := 0; i < depth; i++ {
		v = []any{v}
	}
	return v
}

// fzCount counts the rows of one of the schema's tables.
func fzCount(t *testing.T, pool *pgxpool.Pool, schema, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+"."+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

// fzTyped reports whether err is one of the typed answers to bad input.
func fzTyped(err error, sentinels ...error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func fzNoop(context.Context, *gendurable.Run[json.RawMessage]) error { return nil }

// FuzzInsertInput: insert options (queue, partition and unique keys, unique
// scope, priority, attempts, run-in) and state payloads (raw JSON bytes:
// invalid, huge, NUL escapes, invalid UTF-8; or values nested `nest` deep),
// one at a time or as a batch of two, against a 64 KiB or 1 MiB state
// limit. Rejections are typed and write nothing.
func FuzzInsertInput(f *testing.F) {
	f.Add("default", "", "", 0, 0, int64(0), uint8(0), []byte(`{"a":1}`), uint32(0), false, false)
	f.Add("q\x00ueue", "pk", "uk", 40000, -1, int64(-5), uint8(0x3f), []byte(`{"a":"\u0000"}`), uint32(0), true, true)
	f.Add("", "\xff\xfe", "\x00", -40000, 1<<40, int64(1)<<62, uint8(0x10), []byte("\xff"), uint32(0), false, true)
	f.Add(strings.Repeat("q", 300), strings.Repeat("k", 1001), strings.Repeat("u", 1001), 1, 3, int64(1e6), uint8(0x0f), []byte(`[`), uint32(0), true, false)
	f.Add("default", "", "", 0, 0, int64(0), uint8(0), []byte(`null`), uint32(100000), false, false)
	f.Add("default", "", "", 0, 0, int64(0), uint8(0), []byte(`{}`), uint32(20000), false, true)
	f.Add("default", "", "dup", 0, 0, int64(0), uint8(0x30), []byte(`"`+strings.Repeat("x", 70000)+`"`), uint32(0), true, true)

	pool, schema := dbtest.NewSchema(f, nil)
	raw := &gendurable.Job[json.RawMessage]{Name: "fz_raw", Perform: fzNoop}
	deep := &gendurable.Job[fzState]{Name: "fz_deep", Perform: func(context.Context, *gendurable.Run[fzState]) error { return nil }}
	engines := map[bool]*gendurable.Engine{}
	for _, small := range []bool{false, true} {
		cfg := &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{raw, deep}}
		if small {
			cfg.MaxStateBytes = 64 << 10
		}
		eng, err := gendurable.New(pool, cfg)
		if err != nil {
			f.Fatal(err)
		}
		engines[small] = eng
	}
	statuses := []gendurable.Status{gendurable.StatusRunnable, gendurable.StatusExecuting, gendurable.StatusAwaitingSignal,
		gendurable.StatusAwaitingChildren, gendurable.StatusDone, gendurable.StatusFailed}

	f.Fuzz(func(t *testing.T, queue, partitionKey, uniqueKey string, priority, maxAttempts int, runInUs int64,
		scopeMask uint8, state []byte, nest uint32, many, small bool) {
		eng := engines[small]
		opts := gendurable.InsertOpts{Queue: queue, PartitionKey: partitionKey, UniqueKey: uniqueKey,
			Priority: priority, MaxAttempts: maxAttempts, RunIn: time.Duration(runInUs) * time.Microsecond}
		for k, st := range statuses {
			if scopeMask&(1<<k) != 0 {
				opts.UniqueScope = append(opts.UniqueScope, st)
			}
		}
		var p gendurable.InsertParams
		if nest > 0 {
			p = deep.New(fzState{V: fzNested(int(nest % 300000))}).With(opts)
		} else {
			p = raw.New(json.RawMessage(state)).With(opts)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		before := fzCount(t, pool, schema, "gendurable_instances")
		var res []gendurable.InsertResult
		var err error
		if many {
			res, err = eng.InsertMany(ctx, []gendurable.InsertParams{p, p})
		} else {
			var r gendurable.InsertResult
			if r, err = eng.Insert(ctx, p); err == nil {
				res = []gendurable.InsertResult{r}
			}
		}
		after := fzCount(t, pool, schema, "gendurable_instances")
		if err != nil {
			if !fzTyped(err, gendurable.ErrInvalidInsert, gendurable.ErrStateEncode) {
				t.Fatalf("untyped insert error: %v", err)
			}
			if after != before {
				t.Fatalf("rejected insert (%v) changed the row count %d → %d", err, before, after)
			}
			return
		}
		added := 0
		for _, r := range res {
			if !r.Duplicate {
				added++
			}
		}
		if after-before != added {
			t.Fatalf("insert reported %d new rows, the table grew by %d", added, after-before)
		}
	})
}

// FuzzSignalInput: signal names, payloads (raw JSON bytes, or a value nested
// `nest` deep) and dedup keys,
// to a live, a finished and an unknown instance, against a 1 KiB or the
// default 256 KiB payload limit. Rejections are typed and write nothing (no signal, no inbox
// change).
func FuzzSignalInput(f *testing.F) {
	f.Add("pay", []byte(`{"cents":42}`), "", uint8(0), false, uint32(0))
	f.Add("", []byte(`null`), "k", uint8(0), false, uint32(0))
	f.Add("p\x00y", []byte(`1`), "\x00", uint8(0), false, uint32(0))
	f.Add("\xff", []byte("\xff\xfe"), "\xff", uint8(1), false, uint32(0))
	f.Add(strings.Repeat("n", 201), []byte(`"`+strings.Repeat("x", 2000)+`"`), strings.Repeat("d", 1001), uint8(2), false, uint32(0))
	f.Add("pay", []byte(`{"a":"\u0000"}`), "dedup", uint8(0), true, uint32(0))
	f.Add("pay", []byte(strings.Repeat("[", 600)+strings.Repeat("]", 600)), "deep", uint8(0), false, uint32(0))
	f.Add("pay", []byte(strings.Repeat("[", 9000)+strings.Repeat("]", 9000)), "deeper", uint8(0), true, uint32(0))
	f.Add("pay", []byte(`{"a":`), "", uint8(0), true, uint32(0))
	f.Add("pay", []byte(`null`), "nested value", uint8(0), true, uint32(30000))

	pool, schema := dbtest.NewSchema(f, nil)
	job := &gendurable.Job[json.RawMessage]{Name: "fz_sig", Perform: fzNoop}
	engines := map[bool]*gendurable.Engine{} // true: the default 256 KiB payload limit; false: 1 KiB
	for _, big := range []bool{false, true} {
		cfg := &gendurable.Config{Schema: schema, Machines: []gendurable.Definition{job}}
		if !big {
			cfg.MaxSignalBytes = 1024
		}
		eng, err := gendurable.New(pool, cfg)
		if err != nil {
			f.Fatal(err)
		}
		engines[big] = eng
	}
	eng := engines[false]
	ctx := context.Background()
	live, err := eng.Insert(ctx, job.New(json.RawMessage(`{}`)).With(gendurable.InsertOpts{RunIn: time.Hour}))
	if err != nil {
		f.Fatal(err)
	}
	finished, err := eng.Insert(ctx, job.New(json.RawMessage(`{}`)))
	if err != nil {
		f.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE "+schema+".gendurable_instances SET status = 'done', finished_at = now() WHERE id = $1", finished.ID); err != nil {
		f.Fatal(err)
	}
	targets := []int64{live.ID, finished.ID, finished.ID + 1000}

	f.Fuzz(func(t *testing.T, name string, payload []byte, dedup string, target uint8, big bool, nest uint32) {
		eng := engines[big]
		var value any = json.RawMessage(payload)
		if nest > 0 {
			value = fzNested(int(nest % 300000)) // a Go value: no encoder depth limit
		}
		id := targets[int(target)%len(targets)]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		inbox := func() string {
			var s string
			_ = pool.QueryRow(ctx, "SELECT inbox::text FROM "+schema+".gendurable_instances WHERE id = $1", id).Scan(&s)
			return s
		}
		before, inboxBefore := fzCount(t, pool, schema, "gendurable_signals"), inbox()
		res, err := eng.Signal(ctx, id, name, value, &gendurable.SignalOpts{DedupKey: dedup})
		after := fzCount(t, pool, schema, "gendurable_signals")
		if err != nil {
			if !fzTyped(err, gendurable.ErrInvalidSignal, gendurable.ErrNotFound, gendurable.ErrInstanceFinished) {
				t.Fatalf("untyped signal error: %v", err)
			}
			if after != before || inbox() != inboxBefore {
				t.Fatalf("rejected signal (%v) wrote: %d → %d signals, inbox %s → %s", err, before, after, inboxBefore, inbox())
			}
			return
		}
		if id != live.ID {
			t.Fatalf("a signal to instance %d (finished or unknown) was accepted", id)
		}
		want := 1
		if res.Duplicate {
			want = 0
		}
		if after-before != want {
			t.Fatalf("signal (duplicate %v) grew the table by %d", res.Duplicate, after-before)
		}
	})
}

var fzIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// FuzzSchemaName: hostile schema names. A name is accepted iff it is a
// plain identifier of 1-63 bytes and not a system schema's
// (information_schema, pg_…) (or, for Config, empty: the default);
// anything else is ErrInvalidConfig from New and ErrInvalidSchema from
// migrate, before any SQL runs (no schema appears).
func FuzzSchemaName(f *testing.F) {
	for _, s := range []string{"public", "", "a", `x"; DROP TABLE y; --`, "sch ema", "Ünïcode", "\x00", "1abc",
		strings.Repeat("s", 63), strings.Repeat("s", 64), "a.b", "pg_catalog", "pg_temp", "pg_toast", "information_schema", "pg", "Pg_x", `"quoted"`, "a;b", "a\nb", "_x9"} {
		f.Add(s)
	}
	pool, _ := dbtest.NewSchema(f, &dbtest.Options{NoMigrate: true})
	ctx := context.Background()
	// Schemas of the database but the tests' own (dbtest's gdtest_…, which
	// tests running beside this one create and drop).
	schemas := func(t *testing.T) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname NOT LIKE 'gdtest\_%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	f.Fuzz(func(t *testing.T, name string) {
		valid := len(name) <= 63 && fzIdent.MatchString(name) && name != "information_schema" && !strings.HasPrefix(name, "pg_")
		_, err := gendurable.New(pool, &gendurable.Config{Schema: name})
		switch {
		case name == "": // Config's zero value: the default schema
			if err != nil {
				t.Fatalf("empty Config.Schema (default %q) rejected: %v", gendurable.DefaultSchema, err)
			}
		case valid && err != nil:
			t.Fatalf("plain identifier %q rejected: %v", name, err)
		case !valid && !errors.Is(err, gendurable.ErrInvalidConfig):
			t.Fatalf("hostile schema name %q: want ErrInvalidConfig, got %v", name, err)
		}
		sql, err := migrate.SQL(name, 0, migrate.Latest())
		switch {
		case valid && (err != nil || !strings.Contains(sql, `"`+name+`"`)):
			t.Fatalf("migrate.SQL(%q): %v (name not quoted in the DDL)", name, err)
		case !valid && !errors.Is(err, gendurable.ErrInvalidSchema):
			t.Fatalf("migrate.SQL(%q): want ErrInvalidSchema, got %v", name, err)
		}
		if valid {
			return // never create arbitrary schemas in the shared database
		}
		before := schemas(t)
		_, err = migrate.Up(ctx, pool, name)
		if !errors.Is(err, gendurable.ErrInvalidSchema) {
			t.Fatalf("migrate.Up(%q): want ErrInvalidSchema, got %v", name, err)
		}
		if after := schemas(t); after != before {
			t.Fatalf("migrate.Up(%q) was rejected but the schema count went %d → %d", name, before, after)
		}
	})
}
