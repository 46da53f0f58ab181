package executor

import (
	"context"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgxpool"
)

// partitionLock is a held partition key: a pool connection whose session
// owns the key's advisory lock (docs/design.md §6). No two steps of
// instances sharing a key run at the same time, in any process: the picker
// skips keys already executing, and this lock closes the races the
// picker's snapshot cannot see (two picks at once, a reaped worker that is
// still running its step).
type partitionLock struct {
	x    *Executor
	conn *pgxpool.Conn
	key  string
}

// unlockTimeout bounds unlocking a key; a session that might still hold it
// is closed instead.
const unlockTimeout = 5 * time.Second

// lockPartition takes c's key on a dedicated connection. If another session
// holds it, the row goes back to runnable (after PartitionRetryDelay, with
// an event) and ok is false.
func (x *Executor) lockPartition(ctx context.Context, queue string, c *sqlq.Claimed) (*partitionLock, bool) {
	key := *c.PartitionKey
	// Bound the connections partitioned steps pin, so that picks,
	// heartbeats and outcomes always find one: a full pool degrades to
	// waiting here instead of starving the heartbeat into lease expiry.
	select {
	case x.partitionSlots <- struct{}{}:
	case <-ctx.Done():
		x.releaseClaim(c, 0)
		return nil, false
	}
	conn, err := x.cfg.Pool.Acquire(ctx)
	if err != nil {
		<-x.partitionSlots
		x.cfg.Log.Warn("gendurable: no connection for a partitioned step; releasing the row", "queue", queue, "id", c.ID, "err", err)
		x.releaseClaim(c, x.cfg.PartitionRetryDelay)
		return nil, false
	}
	got, err := x.cfg.Queries.TryPartitionLock(ctx, conn, key)
	if err != nil || !got {
		conn.Release()
		<-x.partitionSlots
		if err != nil {
			x.cfg.Log.Warn("gendurable: partition lock failed; releasing the row", "queue", queue, "id", c.ID, "err", err)
		}
		x.releaseClaim(c, x.cfg.PartitionRetryDelay)
		x.cfg.Events.PartitionContended(context.WithoutCancel(ctx), queue, c, key)
		return nil, false
	}
	return &partitionLock{x: x, conn: conn, key: key}, true
}

// release unlocks the key after the outcome committed. A session that might
// still hold the lock is never returned to the pool: it is closed, which
// frees the lock with it.
func (l *partitionLock) release() {
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	ok, err := l.x.cfg.Queries.PartitionUnlock(ctx, l.conn, l.key)
	if err != nil || !ok {
		_ = l.conn.Conn().Close(ctx)
	}
	l.conn.Release()
	<-l.x.partitionSlots
}
