package gendurable

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/stretchr/testify/require"
)

// TestSlotKeysEndInTheirSlotOfAFixedLength: the prune finds a schedule's
// newest slot by the key's last sqlq.SlotKeyTimeLen bytes (its slot, which
// sorts by time), whatever the schedule's name.
func TestSlotKeysEndInTheirSlotOfAFixedLength(t *testing.T) {
	for _, slot := range []time.Time{
		time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 0, time.FixedZone("x", 3600)),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		for _, name := range []string{"a", "with:colons:2026-01-01T00:00:00Z", "ümlaut"} {
			k := slotKey(name, slot)
			if !strings.HasPrefix(k, sqlq.SlotKeyPrefix+name+":") || len(k) != len(sqlq.SlotKeyPrefix+name+":")+sqlq.SlotKeyTimeLen {
				t.Errorf("slot key %q of %q at %s: not the prefix, the name and %d bytes of slot", k, name, slot, sqlq.SlotKeyTimeLen)
			}
		}
	}
}

// TestASlotIsNotInsertedOnceALaterSlotHasARow (a fault probe): a slot's
// insert sent on a connection that was then cut off was given up by its
// engine, the slot inserted and run by another process and its row pruned
// (not its schedule's newest any more); the connection healed, the server
// ran the insert still in flight, found the slot's key free and ran the
// slot a second time. A slot's row is inserted only while no row of a later
// slot of its schedule is in the table — which the prune, keeping each
// schedule's newest slot, leaves there once it may have deleted the slot's
// own — and other schedules' slots, whatever their names, do not count.
func TestASlotIsNotInsertedOnceALaterSlotHasARow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	job := &Job[struct{}]{Name: "tick", Perform: func(context.Context, *Run[struct{}]) error { return nil }}
	e, err := New(pool, &Config{Schema: schema, Machines: []Definition{job}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	schedule := func(name string) *Periodic {
		return &Periodic{Name: name, Schedule: "@every 1m", New: func(time.Time) InsertParams { return job.New(struct{}{}) }}
	}
	slot := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return slot.Add(time.Duration(m) * time.Minute) }
	rows := func(name string, s time.Time) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".gendurable_instances WHERE unique_key = $1`,
			[]byte(slotKey(name, s))).Scan(&n))
		return n
	}
	insert := func(name string, s time.Time) (int64, bool) {
		t.Helper()
		id, dup, err := e.insertSlot(ctx, schedule(name), s)
		require.NoError(t, err)
		return id, dup
	}

	// Later slots of other schedules: names this one's is a prefix of, or
	// that start with it and a colon, or that sort just before it.
	for _, other := range []string{"ever", "everyone", "every:x", "every:2026-11-30T10:05:00Z", "everx"} {
		_, dup := insert(other, at(5))
		require.False(t, dup, other)
	}
	id, dup := insert("every", at(0))
	require.False(t, dup)
	require.NotZero(t, id)
	_, dup = insert("every", at(2))
	require.False(t, dup)

	// The slot between them comes late: a later slot has a row.
	id, dup = insert("every", at(1))
	require.True(t, dup, "a slot older than the schedule's latest row is not inserted")
	require.Zero(t, id)
	require.Zero(t, rows("every", at(1)))

	// Its own row gone (pruned), the later one there: still not inserted.
	_, err = pool.Exec(ctx, `DELETE FROM "`+schema+`".gendurable_instances WHERE unique_key = $1`, []byte(slotKey("every", at(0))))
	require.NoError(t, err)
	_, dup = insert("every", at(0))
	require.True(t, dup)
	require.Zero(t, rows("every", at(0)))

	// The next slot goes in, once.
	_, dup = insert("every", at(3))
	require.False(t, dup)
	_, dup = insert("every", at(3))
	require.True(t, dup)
	require.Equal(t, 1, rows("every", at(3)))
}
