package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
)

// Pruner deletes instances that finished (done or failed) longer than
// Retention ago, with their signals, every Interval, and then the rate
// buckets of Policies that have been full for BucketsFull (RunBuckets).
//
// Each batch — one transaction — runs under BatchTimeout, a generous bound
// (by default PruneTimeoutFactor statement timeouts, 5 minutes; the engine's
// is 10 × Config.MaintenanceTimeout, 10 minutes at the default lease): a
// batch of Batch rows that runs this long is not pruning but stuck, on a
// dead connection or behind a lock. It is rolled back (the transaction
// ends with its connection, which pgx closes), logged, and the next
// Interval tries again; what it would have deleted stays until then.
type Pruner struct {
	BaseService

	Queries *sqlq.Queries
	// DB: each batch of instances runs in a transaction of its own, a batch
	// of buckets in one statement.
	DB interface {
		sqlq.DB
		sqlq.Beginner
	}
	Interval  time.Duration // between sweeps; must be positive to Start
	Retention time.Duration // of the sweeps Start runs; must be positive to Start
	Batch     int           // rows per statement; default DefaultBatch
	Log       *slog.Logger  // default slog.Default()
	// BatchTimeout bounds each batch's transaction; default
	// PruneBatchTimeout(DefaultStatementTimeout).
	BatchTimeout time.Duration
	// Policies are the key policies whose rate buckets RunBuckets deletes
	// once full for BucketsFull; without a rated one it deletes none.
	Policies []sqlq.KeyPolicy
	// BucketsFull is how long a bucket must have been full to be deleted:
	// at least as long as a pick may run (its lease). Default, and at
	// least, a minute.
	BucketsFull time.Duration
}

// PruneBatchTimeout is the deadline of a prune batch for a statement
// timeout of d: PruneTimeoutFactor × d, or the longest Duration when that
// product does not fit in one (it would wrap around to a negative
// deadline, which fails every batch at once).
func PruneBatchTimeout(d time.Duration) time.Duration {
	if d > math.MaxInt64/PruneTimeoutFactor {
		return math.MaxInt64
	}
	return PruneTimeoutFactor * d
}

// Start prunes every Interval until Stop or until ctx is done.
func (p *Pruner) Start(ctx context.Context) error {
	if p.Interval <= 0 || p.Retention <= 0 {
		return fmt.Errorf("gendurable: pruner: interval %s and retention %s must be positive", p.Interval, p.Retention)
	}
	return p.StartLoop(ctx, func(ctx context.Context) {
		every(ctx, p.Interval, func() {
			n, err := p.RunOnce(ctx, p.Retention, nil)
			switch {
			case err != nil && ctx.Err() == nil:
				logger(p.Log).Warn("gendurable: prune failed", sqlq.ErrAttrs(err)...)
			case n > 0:
				logger(p.Log).Info("gendurable: pruned finished instances", "deleted", n, "retention", p.Retention)
			}
			n, err = p.RunBuckets(ctx)
			p.LogBuckets(ctx, n, err)
		})
	})
}

// RunOnce deletes the instances that finished more than retention ago, in
// batches, each from where the last ended, until one comes back short (what
// it passes by is the next sweep's: sqlq.Prune); progress, if not nil, is called after each
// batch that deleted rows with the running total. It returns the number
// deleted.
func (p *Pruner) RunOnce(ctx context.Context, retention time.Duration, progress func(deleted int64)) (int64, error) {
	batch := orDefault(p.Batch, DefaultBatch)
	n, err := inBatches(ctx, p.BatchTimeout, "prune", progress, func(ctx context.Context, from *time.Time) (int64, *time.Time, error) {
		return p.Queries.Prune(ctx, p.DB, retention, batch, from)
	})
	if err != nil {
		return n, err
	}
	_, err = p.ClearLeases(ctx)
	return n, err
}

// LeaseClearAfter is how long past its end ClearLeases leaves a finished
// row's lease.
const LeaseClearAfter = time.Minute

// ClearLeases clears the leases that finished rows kept from a cancel
// mid-step and that ran out more than LeaseClearAfter ago, Batch per
// statement, until a statement clears fewer (sqlq.ClearExpiredLeases).
// Past, such a lease holds nothing, but every pick of the row's key read
// it. It returns the number cleared. RunOnce runs it after its batches.
func (p *Pruner) ClearLeases(ctx context.Context) (int64, error) {
	batch := orDefault(p.Batch, DefaultBatch)
	return inBatches(ctx, p.BatchTimeout, "clear expired leases", nil, func(ctx context.Context, _ *struct{}) (int64, *struct{}, error) {
		n, more, err := p.Queries.ClearExpiredLeases(ctx, p.DB, batch, LeaseClearAfter)
		if more {
			return n, &struct{}{}, err
		}
		return n, nil, err
	})
}

// inBatches runs one batch statement after another, each under
// batchTimeout (0: PruneBatchTimeout of the default statement timeout) and
// from where the last one said the next starts, until one says none does;
// progress, if not nil, is called after each batch that deleted rows with
// the running total. It returns the number deleted; on error, the number
// deleted before it.
func inBatches[C any](ctx context.Context, batchTimeout time.Duration, what string, progress func(int64),
	batch func(ctx context.Context, from *C) (int64, *C, error)) (int64, error) {
	var total int64
	var from *C
	for {
		var n int64
		err := bounded(ctx, orDefault(batchTimeout, PruneBatchTimeout(DefaultStatementTimeout)), func(ctx context.Context) (err error) {
			n, from, err = batch(ctx, from)
			return err
		})
		total += n
		if err != nil {
			return total, fmt.Errorf("gendurable: %s: %w", what, err)
		}
		if progress != nil && n > 0 {
			progress(total)
		}
		if from == nil {
			return total, nil
		}
	}
}

// rated reports whether any of policies has a rate.
func rated(policies []sqlq.KeyPolicy) bool {
	for _, k := range policies {
		if k.Rate > 0 {
			return true
		}
	}
	return false
}

// RunBuckets deletes the rate buckets full for BucketsFull under Policies
// (a missing bucket is a full one to the pick: sqlq.PruneBuckets), Batch
// keys looked at per statement, each under BatchTimeout, until one looks
// at fewer. It returns the number deleted; on error, the number deleted
// before it. Without a rated policy it sends nothing.
func (p *Pruner) RunBuckets(ctx context.Context) (int64, error) {
	if !rated(p.Policies) {
		return 0, nil
	}
	batch := orDefault(p.Batch, DefaultBatch)
	return inBatches(ctx, p.BatchTimeout, "prune rate buckets", nil, func(ctx context.Context, from *string) (int64, *string, error) {
		return p.Queries.PruneBuckets(ctx, p.DB, p.Policies, max(p.BucketsFull, time.Minute), batch, from)
	})
}

// LogBuckets logs what RunBuckets(ctx) returned: a failure at Warn (unless
// ctx ended it), deleted buckets at Info.
func (p *Pruner) LogBuckets(ctx context.Context, n int64, err error) {
	switch {
	case err != nil && ctx.Err() == nil:
		logger(p.Log).Warn("gendurable: prune of rate buckets failed", append(sqlq.ErrAttrs(err), "deleted", n)...)
	case n > 0:
		logger(p.Log).Info("gendurable: pruned full rate buckets", "deleted", n)
	}
}
