package gendurable_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// TestAdminInputIsValidated: NUL, invalid UTF-8, control characters and
// oversized text in list filters, queue and machine names are
// ErrInvalidInput before any SQL runs (the database would answer 22021),
// and a refused pause writes no queue row.
func TestAdminInputIsValidated(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("validated")
	b := setup(t, nil, job)
	ctx := context.Background()
	id := b.insert(job.New(orderArgs{I: 1}).With(gendurable.InsertOpts{Queue: "café", PartitionKey: "ключ"}))

	bad := map[string]string{
		"nul":       "a\x00b",
		"invalid":   "\xff\xfe",
		"control":   "\x1b[2J",
		"c1":        "a\u0085b",
		"del":       "a\x7fb",
		"too long":  strings.Repeat("q", 1001),
		"truncated": "caf\xc3",
	}
	for name, v := range bad {
		for _, f := range []gendurable.ListFilter{{Queue: v}, {Machine: v}, {Step: v}, {Search: v}} {
			_, err := b.eng.List(ctx, f)
			require.ErrorIs(t, err, gendurable.ErrInvalidInput, "%s: %+v", name, f)
		}
		require.ErrorIs(t, b.eng.Pause(ctx, v), gendurable.ErrInvalidInput, name)
		require.ErrorIs(t, b.eng.Resume(ctx, v), gendurable.ErrInvalidInput, name)
		_, err := b.eng.Graph(ctx, v)
		require.ErrorIs(t, err, gendurable.ErrInvalidInput, name)
	}
	for _, v := range []string{"", strings.Repeat("q", 201)} {
		require.ErrorIs(t, b.eng.Pause(ctx, v), gendurable.ErrInvalidInput, "%q", v)
	}
	_, err := b.eng.List(ctx, gendurable.ListFilter{Status: "nope"})
	require.ErrorIs(t, err, gendurable.ErrInvalidInput)
	var queues int
	require.NoError(t, b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.gendurable_queues`, b.schema)).Scan(&queues))
	require.Zero(t, queues, "no refused pause wrote a row")

	// Valid non-ASCII text still filters and searches.
	for _, f := range []gendurable.ListFilter{{Queue: "café"}, {Search: "ключ"}, {Search: fmt.Sprint(id)}} {
		page, err := b.eng.List(ctx, f)
		require.NoError(t, err, "%+v", f)
		require.Len(t, page.Instances, 1, "%+v", f)
		require.Equal(t, id, page.Instances[0].ID)
	}
	require.NoError(t, b.eng.Pause(ctx, "café"))
}

// TestListLooksAtABoundedWindow: a filter that matches only old rows gets
// short, partial pages that say where they stopped, and paging on finds
// every match once; a search by key finds its rows in any status.
func TestListLooksAtABoundedWindow(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("windowed")
	b := setup(t, nil, job)
	ctx := context.Background()
	var ps []gendurable.InsertParams
	for i := range 3 {
		ps = append(ps, job.New(orderArgs{I: i}).With(gendurable.InsertOpts{Queue: "old", PartitionKey: "pk"}))
	}
	for i := range 25 {
		ps = append(ps, job.New(orderArgs{I: i}))
	}
	res, err := b.eng.InsertMany(ctx, ps)
	require.NoError(t, err)
	require.NoError(t, b.eng.Cancel(ctx, res[1].ID, "finished rows are found too"))

	var found []int64
	partial := 0
	f := gendurable.ListFilter{Queue: "old", MaxScan: 10, Limit: 2}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		page, err := b.eng.List(ctx, f)
		require.NoError(t, err)
		require.LessOrEqual(t, page.Scanned, 10)
		for _, in := range page.Instances {
			found = append(found, in.ID)
		}
		if page.Partial {
			partial++
			require.Less(t, len(page.Instances), 2, "a partial page did not fill up")
			require.Equal(t, 10, page.Scanned)
			require.NotZero(t, page.NextBefore)
		}
		if page.NextBefore == 0 {
			break
		}
		f.Before = page.NextBefore
	}
	require.Equal(t, []int64{res[2].ID, res[1].ID, res[0].ID}, found)
	require.Equal(t, 2, partial, "28 rows in windows of 10: two windows held no match")

	page, err := b.eng.List(ctx, gendurable.ListFilter{Search: "pk"})
	require.NoError(t, err)
	require.Len(t, page.Instances, 3)
	require.Equal(t, gendurable.StatusFailed, page.Instances[1].Status)
	require.False(t, page.Partial)
	require.Zero(t, page.Scanned, "Scanned is reported for partial pages")
}

// TestNamesAndKeysShareOneRule: what an insert or a config may hold, an
// operator can filter, pause and remove, and the reverse: a queue name or
// partition key with a control character is refused at insert
// (ErrInvalidInsert) and in config (ErrInvalidConfig), as the admin API
// refuses it (ErrInvalidInput) — RemoveQueue included.
func TestNamesAndKeysShareOneRule(t *testing.T) {
	t.Parallel()
	job := (&recorder{}).job("onerule")
	b := setup(t, nil, job)
	ctx := context.Background()
	for _, v := range []string{"tab\tqueue", "esc\x1b[2J", "a\x00b", "\xff", "a\u0085b"} {
		_, err := b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: v}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "queue %q", v)
		_, err = b.eng.Insert(ctx, job.New(orderArgs{}).With(gendurable.InsertOpts{PartitionKey: v}))
		require.ErrorIs(t, err, gendurable.ErrInvalidInsert, "partition key %q", v)
		require.ErrorIs(t, b.eng.RemoveQueue(ctx, v), gendurable.ErrInvalidInput, "remove %q", v)
		_, err = gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Queues: map[string]gendurable.QueueConfig{v: {}}})
		require.ErrorIs(t, err, gendurable.ErrInvalidConfig, "config queue %q", v)
		bad := &gendurable.Job[orderArgs]{Name: v, Perform: func(context.Context, *gendurable.Run[orderArgs]) error { return nil }}
		_, err = gendurable.New(b.pool, &gendurable.Config{Schema: b.schema, Machines: []gendurable.Definition{bad}})
		require.ErrorIs(t, err, gendurable.ErrInvalidConfig, "machine name %q", v)
	}
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, ""), gendurable.ErrInvalidInput)
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.gendurable_instances`, b.schema)).Scan(&n))
	require.Zero(t, n, "no refused insert wrote a row")

	// Printable non-ASCII names and keys work everywhere.
	id := b.insert(job.New(orderArgs{}).With(gendurable.InsertOpts{Queue: "naïve queue", PartitionKey: "clé 1"}))
	for _, f := range []gendurable.ListFilter{{Queue: "naïve queue"}, {Search: "clé 1"}} {
		page, err := b.eng.List(ctx, f)
		require.NoError(t, err)
		require.Len(t, page.Instances, 1)
		require.Equal(t, id, page.Instances[0].ID)
	}
	require.NoError(t, b.eng.Pause(ctx, "naïve queue"))
	require.ErrorIs(t, b.eng.RemoveQueue(ctx, "naïve queue"), gendurable.ErrQueueNotEmpty)
}
