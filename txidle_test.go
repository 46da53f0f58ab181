package gendurable_test

import (
	"context"
	"testing"
	"time"

	"github.com/gendurable/gendurable"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestWithTxIdleTimeoutBeyondTheServersRange: the server takes
// idle_in_transaction_session_timeout in milliseconds up to 2^31-1 (about
// 24.8 days). A longer Config.TxIdleTimeout — or a LeaseDuration that long,
// TxIdleTimeout's default — must still let WithTx steps run, not make
// every BEGIN fail.
func TestWithTxIdleTimeoutBeyondTheServersRange(t *testing.T) {
	t.Parallel()
	m := &gendurable.Machine[orderArgs]{
		Name: "farlimit", Start: "pay",
		Steps: map[string]gendurable.StepFunc[orderArgs]{
			"pay": func(context.Context, *gendurable.Run[orderArgs]) (gendurable.Outcome, error) {
				return gendurable.Done(nil).WithTx(func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "SELECT 1")
					return err
				}), nil
			},
		},
	}
	cfg := fastConfig("", m)
	cfg.TxIdleTimeout = 30 * 24 * time.Hour
	b := setup(t, cfg)
	b.start()
	id := b.insert(m.New(orderArgs{}))
	r := b.waitStatus(id, "done", 20*time.Second)
	require.Equal(t, 0, r.Attempt, "%v", r.Errors)
}
