package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestConnectionFailureClassification: which WithTx callback errors are the
// infrastructure's (no attempt counted) rather than the step's.
func TestConnectionFailureClassification(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("callback: %w", &pgconn.PgError{Code: code}) }
	for _, c := range []struct {
		err  error
		want bool
	}{
		{pg("57P01"), true}, // admin shutdown (pg_terminate_backend)
		{pg("57P02"), true}, // crash shutdown
		{pg("57P03"), true}, // cannot connect now
		{pg("53300"), true}, // too many clients
		{pg("08006"), true}, // connection failure
		{pg("08P01"), true}, // protocol violation
		{&net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, true},
		{io.ErrUnexpectedEOF, true},
		{fmt.Errorf("x: %w", net.ErrClosed), true},
		{pg("23505"), false}, // unique violation: the step's own
		{pg("40001"), false}, // serialization failure: the step's own transaction
		{pg("57014"), false}, // query cancelled
		{context.Canceled, false},
		{context.DeadlineExceeded, false},
		{os.ErrDeadlineExceeded, true}, // an I/O deadline on the socket
		{errors.New("insufficient funds"), false},
	} {
		require.Equal(t, c.want, connectionFailure(c.err), "%v", c.err)
	}
}

// BenchmarkOutcomeBatch measures adding outcomes to a reused batch (the
// group committer's per-outcome cost before the statement).
func BenchmarkOutcomeBatch(b *testing.B) {
	step, state := "b", `{"order":"A-1","items":["book"],"paid":1}`
	o := sqlq.Outcome{ID: 1, Token: 2, Kind: sqlq.KindNext, Step: &step, State: &state, Continue: true}
	var batch sqlq.OutcomeBatch
	b.ReportAllocs()
	for b.Loop() {
		batch.Reset()
		for range 100 {
			batch.Add(&o)
		}
	}
}
