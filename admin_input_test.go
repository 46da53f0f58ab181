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
