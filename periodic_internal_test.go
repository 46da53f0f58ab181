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

// TestASlotIsNotInsertedOnceALaterSlotHasARow: a fault probe saw a slot
// run twice — its insert, sent on a connection that was then cut off, was
// given up by its engine, the slot inserted and run by another process and
// its row pruned (not its schedule's newest any more); the connection
// healed, the server ran the insert still in flight and found the slot's
// key free. This test stands in for that late insert by calling the slot's
// insert after the later slot's row went in and the slot's own was deleted:
// a slot's row is inserted only while no row of a later slot of its
// schedule whose time has come is in the table (which the prune, keeping
// each schedule's newest such row, leaves there once it may have deleted
// the slot's own). Other schedules' slots, whatever their names, do not
// count, nor does a slot's row inserted before its time (a process whose
// clock is ahead: a review's row a day ahead silenced the schedule).
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

	// A row of a slot whose time has not come (inserted early by a process
	// whose clock is ahead) does not keep the slots before it out.
	ahead := time.Now().Add(24 * time.Hour).Truncate(time.Second)
	_, dup = insert("every", ahead)
	require.False(t, dup)
	_, dup = insert("every", at(4))
	require.False(t, dup, "a slot's row before its time does not count")
	require.Equal(t, 1, rows("every", at(4)))

	// Nor does it for a prune: the newest slot whose time has come is
	// kept, and it keeps the late insert of the one before it out.
	_, err = pool.Exec(ctx, `UPDATE "`+schema+`".gendurable_instances SET status = 'done', finished_at = now() - interval '1 hour'
		WHERE unique_key <> $1`, []byte(slotKey("every", ahead)))
	require.NoError(t, err)
	_, err = e.Prune(ctx, time.Minute, nil)
	require.NoError(t, err)
	require.Equal(t, 1, rows("every", at(4)), "the newest slot whose time has come is kept")
	require.Zero(t, rows("every", at(3)))
	_, dup = insert("every", at(3))
	require.True(t, dup)
	require.Zero(t, rows("every", at(3)))
}
