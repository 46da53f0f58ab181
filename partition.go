package gendurable

import (
	"context"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgxpool"
)

// partitionLock is a held partition key: a pool connection whose session
// owns the key's advisory lock. No two steps of instances sharing a key run
// at the same time, in any process: the picker skips keys already executing,
// and this lock closes the races the picker's snapshot cannot see (two
// picks at once, a reaped worker that is still running its step).
type partitionLock struct {
	e    *Engine
	conn *pgxpool.Conn
	key  string
}

// lockPartition takes c's key on a dedicated connection. If another session
// holds it, the row goes back to runnable (after PartitionRetryDelay, with
// an event) and ok is false.
func (e *Engine) lockPartition(ctx context.Context, queue string, c *sqlq.Claimed) (*partitionLock, bool) {
	key := *c.PartitionKey
	// Bound the connections partitioned steps pin, so that picks,
	// heartbeats and outcomes always find one: a full pool degrades to
	// waiting here instead of starving the heartbeat into lease expiry.
	select {
	case e.partitionSlots <- struct{}{}:
	case <-ctx.Done():
		e.releaseClaim(c, 0)
		return nil, false
	}
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		<-e.partitionSlots
		e.log.Warn("gendurable: no connection for a partitioned step; releasing the row", "queue", queue, "id", c.ID, "err", err)
		e.releaseClaim(c, e.cfg.PartitionRetryDelay)
		return nil, false
	}
	got, err := e.q.TryPartitionLock(ctx, conn, key)
	if err != nil || !got {
		conn.Release()
		<-e.partitionSlots
		if err != nil {
			e.log.Warn("gendurable: partition lock failed; releasing the row", "queue", queue, "id", c.ID, "err", err)
		}
		e.releaseClaim(c, e.cfg.PartitionRetryDelay)
		e.emit(ctx, &PartitionContendedEvent{Queue: queue, InstanceID: c.ID, PartitionKey: key})
		return nil, false
	}
	return &partitionLock{e: e, conn: conn, key: key}, true
}

// release unlocks the key after the outcome committed. A session that might
// still hold the lock is never returned to the pool: it is closed, which
// frees the lock with it.
func (l *partitionLock) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, err := l.e.q.PartitionUnlock(ctx, l.conn, l.key)
	if err != nil || !ok {
		_ = l.conn.Conn().Close(ctx)
	}
	l.conn.Release()
	<-l.e.partitionSlots
}

// releaseClaim hands a claimed row back to runnable without counting an attempt.
func (e *Engine) releaseClaim(c *sqlq.Claimed, delay time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.q.Release(ctx, e.pool, []int64{c.ID}, []int64{c.Token}, delay); err != nil {
		e.log.Warn("gendurable: release failed; the reaper will recover the row", "id", c.ID, "err", err)
	}
}
