package gendurabletest_test

import (
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/gendurabletest"
	"github.com/stretchr/testify/require"
)

func insertEngine(t *testing.T) *gendurable.Engine {
	db := gendurabletest.NewDB(t, &gendurabletest.DBOpts{MaxConns: 2})
	return db.NewEngine(t, &gendurable.Config{Machines: []gendurable.Definition{orderMachine, shipJob}})
}

func TestRequireInserted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	eng := insertEngine(t)
	book, err := eng.Insert(ctx, orderMachine.New(order{Item: "book"}))
	require.NoError(t, err)
	res, err := eng.Insert(ctx, orderMachine.New(order{Item: "lamp"}).With(gendurable.InsertOpts{Queue: "bulky", Priority: 5}))
	require.NoError(t, err)

	got := gendurabletest.RequireInserted(ctx, t, eng, orderMachine, &gendurabletest.InsertedOpts[order]{
		State: func(s order) bool { return s.Item == "lamp" },
	})
	require.Equal(t, res.ID, got.ID)
	require.Equal(t, order{Item: "lamp"}, got.State)
	require.JSONEq(t, `{"item": "lamp"}`, string(got.Instance.State))
	require.Equal(t, "bulky", got.Queue)
	require.Equal(t, 5, got.Priority)
	require.Equal(t, "charge", got.Step)
	require.Equal(t, gendurable.StatusRunnable, got.Status)

	got = gendurabletest.RequireInserted(ctx, t, eng, orderMachine, &gendurabletest.InsertedOpts[order]{
		Queue: "bulky", Priority: new(5), Step: "charge", Status: gendurable.StatusRunnable,
	})
	require.Equal(t, res.ID, got.ID)
	require.Equal(t, book.ID, gendurabletest.RequireInserted(ctx, t, eng, orderMachine, &gendurabletest.InsertedOpts[order]{
		Priority: new(0),
	}).ID)
	require.Equal(t, book.ID, gendurabletest.RequireInserted(ctx, t, eng, orderMachine, &gendurabletest.InsertedOpts[order]{
		Queue: "default",
	}).ID)
	gendurabletest.RequireNotInserted(ctx, t, eng, orderMachine, &gendurabletest.InsertedOpts[order]{Step: "ship"})
	gendurabletest.RequireNotInserted(ctx, t, eng, orderMachine, &gendurabletest.InsertedOpts[order]{Status: gendurable.StatusDone})
	gendurabletest.RequireNotInserted(ctx, t, eng, shipJob, nil)
}

func TestRequireInsertedFailures(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	eng := insertEngine(t)

	f := newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) { gendurabletest.RequireInserted(ctx, tb, eng, orderMachine, nil) }))
	require.Equal(t, `gendurabletest: want one instance of machine "order" version 1, found none: no instance of machine "order" version 1 was inserted`, f.message())

	a, err := eng.Insert(ctx, orderMachine.New(order{Item: "book"}))
	require.NoError(t, err)
	b, err := eng.Insert(ctx, orderMachine.New(order{Item: "lamp"}).With(gendurable.InsertOpts{Priority: 3}))
	require.NoError(t, err)

	f = newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) {
		gendurabletest.RequireInserted(ctx, tb, eng, orderMachine, &gendurabletest.InsertedOpts[order]{Queue: "bulky", Priority: new(3)})
	}))
	require.Contains(t, f.message(), `want one instance of machine "order" version 1 with queue "bulky", priority 3, found none; inserted were 2:`)
	require.Contains(t, f.message(), `id `+itoa(a.ID)+`: queue "default", priority 0, step "charge", runnable, state {"item": "book"}`)
	require.Contains(t, f.message(), `id `+itoa(b.ID)+`: queue "default", priority 3, step "charge", runnable, state {"item": "lamp"}`)

	f = newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) { gendurabletest.RequireInserted(ctx, tb, eng, orderMachine, nil) }))
	require.Contains(t, f.message(), `found 2 (narrow it with InsertedOpts)`)

	f = newFakeTB(t)
	require.True(t, f.run(func(tb testing.TB) {
		gendurabletest.RequireNotInserted(ctx, tb, eng, orderMachine, &gendurabletest.InsertedOpts[order]{
			State: func(s order) bool { return s.Item == "book" },
		})
	}))
	require.Contains(t, f.message(), `want no instance of machine "order" version 1 with a state matching the predicate, found 1:`)
	require.NotContains(t, f.message(), "lamp")
}

// RequireInsertedTx sees what the transaction inserted; RequireInserted,
// reading through the pool, does not until it commits.
func TestRequireInsertedTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := gendurabletest.NewDB(t, &gendurabletest.DBOpts{MaxConns: 2})
	eng := db.NewEngine(t, &gendurable.Config{Machines: []gendurable.Definition{orderMachine}})
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := eng.InsertTx(ctx, tx, orderMachine.New(order{Item: "book"}))
	require.NoError(t, err)

	got := gendurabletest.RequireInsertedTx(ctx, t, eng, tx, orderMachine, nil)
	require.Equal(t, res.ID, got.ID)
	gendurabletest.RequireNotInserted(ctx, t, eng, orderMachine, nil)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, res.ID, gendurabletest.RequireInserted(ctx, t, eng, orderMachine, nil).ID)
}
