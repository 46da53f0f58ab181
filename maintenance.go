package gendurable

import (
	"context"
	"errors"
	"time"

	"github.com/gendurable/gendurable/internal/maintenance"
	"github.com/gendurable/gendurable/internal/sqlq"
)

// This file wires the maintenance services of internal/maintenance to the
// engine's configuration, hooks and feeders. Their loops live there.

// maintenanceServices returns the maintenance services one Start..Stop
// lifetime runs, in their declared start order; Stop stops them in
// reverse:
//
//  0. the merge of observed transitions into the stored machine
//     definitions (every 10s and once more on Stop, after the feeders
//     drained; only if machines are registered; graph.go);
//  1. the reaper (ReaperInterval);
//  2. the await-timeout sweep (AwaitTimeoutInterval);
//  3. the pruner (PruneInterval and Retention; only if this engine works
//     queues): finished instances, then the full rate buckets of its
//     KeyPolicies;
//  4. the periodic schedules (Config.Periodic).
//
// The services that recover or wake existing rows come first; periodic,
// the one that inserts new work, comes last, so on Stop it is the first to
// stop. All of them start before the feeders and stop after the feeders
// have drained (see Start and Stop).
//
// Every statement they send runs under a deadline of its own,
// Config.MaintenanceTimeout (a prune batch: PruneTimeoutFactor times it),
// so that one stuck on a dead connection does not hold its loop
// (docs/design.md §7).
//
// A service whose interval is negative (or, for the pruner, whose
// Retention is) is not in the list. sweeper is the await-timeout sweep, nil
// if it does not run: local await outcomes poke it.
func (e *Engine) maintenanceServices() (services []maintenance.Service, sweeper *maintenance.TimeoutSweeper) {
	if len(e.registry) > 0 {
		services = append(services, e.observedFlusher())
	}
	if e.cfg.ReaperInterval > 0 {
		r := e.reaper()
		r.Interval = e.cfg.ReaperInterval
		services = append(services, r)
	}
	if interval := orDefault(e.cfg.AwaitTimeoutInterval, e.cfg.ReaperInterval); interval > 0 {
		sweeper = &maintenance.TimeoutSweeper{Queries: e.q, DB: e.pool, Interval: interval,
			StatementTimeout: e.cfg.MaintenanceTimeout, Log: e.log, Kick: e.kickQueue,
			FloorSlack: e.cfg.LeaseDuration + sqlq.WakeFloorSlack}
		services = append(services, sweeper)
	}
	if e.cfg.Retention > 0 && e.cfg.PruneInterval > 0 && len(e.cfg.Queues) > 0 {
		p := e.pruner()
		p.Interval, p.Retention = e.cfg.PruneInterval, e.cfg.Retention
		services = append(services, p)
	}
	if len(e.cfg.Periodic) > 0 {
		p := &maintenance.Periodic{Log: e.log, StatementTimeout: e.cfg.MaintenanceTimeout,
			Schedules: make([]maintenance.Schedule, len(e.cfg.Periodic))}
		for i := range e.cfg.Periodic {
			pp := &e.cfg.Periodic[i]
			p.Schedules[i] = maintenance.Schedule{Name: pp.Name, Next: pp.sched.Next, SkipMissed: pp.SkipMissed,
				CatchUpWithin: max(e.cfg.Retention, 0)}
		}
		p.Insert = func(ctx context.Context, i int, slot time.Time) (int64, bool, error) {
			return e.insertSlot(ctx, &e.cfg.Periodic[i], slot)
		}
		// The instance New built is refused, by the engine or by the
		// database's checks: trying the same slot again gets the same answer.
		p.Permanent = func(err error) bool {
			return errors.Is(err, ErrInvalidInsert) || errors.Is(err, ErrUnknownMachine) || errors.Is(err, ErrStateEncode)
		}
		services = append(services, p)
	}
	return services, sweeper
}

// reaper is a reaper for this engine: its loop runs under Start (with
// ReaperInterval set), its RunOnce is [Engine.Reap].
func (e *Engine) reaper() *maintenance.Reaper {
	return &maintenance.Reaper{Queries: e.q, DB: e.pool, Log: e.log, StatementTimeout: e.cfg.MaintenanceTimeout,
		OnReap: func(ctx context.Context, r *maintenance.Reaped) {
			e.emit(e.ownCall(ctx), &ReapEvent{Count: r.Count, Failed: r.Failed, Uncharged: r.Uncharged, IDs: r.IDs, Duration: r.Duration, Err: r.Err})
		}}
}

// pruner is a pruner for this engine: its loop runs under Start (with
// PruneInterval and Retention set), its RunOnce is [Engine.Prune].
func (e *Engine) pruner() *maintenance.Pruner {
	return &maintenance.Pruner{Queries: e.q, DB: e.pool, Batch: PruneBatch, Log: e.log,
		BatchTimeout: maintenance.PruneBatchTimeout(e.cfg.MaintenanceTimeout),
		Policies:     pickPolicies(e.cfg.KeyPolicies), BucketsFull: e.cfg.LeaseDuration}
}
