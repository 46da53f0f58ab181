package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
)

// Flusher calls Flush every Interval, and once more when it is stopped, so
// that what Flush writes (the engine's observed transitions) survives a
// clean stop. A failed Flush is logged; the next one tries again.
type Flusher struct {
	BaseService
	Name     string
	Interval time.Duration
	Flush    func(ctx context.Context) error
	Log      *slog.Logger
	// FinalTimeout bounds the last Flush on Stop (and so does the context
	// of a StopContext, when it ends sooner). Default 5s.
	FinalTimeout time.Duration
	// StatementTimeout bounds each periodic Flush. Default
	// DefaultStatementTimeout.
	StatementTimeout time.Duration
}

// Start launches the loop.
func (f *Flusher) Start(ctx context.Context) error { return f.StartLoop(ctx, f.loop) }

func (f *Flusher) loop(ctx context.Context) {
	t := time.NewTicker(f.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			timeout := f.FinalTimeout
			if timeout <= 0 {
				timeout = 5 * time.Second
			}
			final, cancel := FinalContext(ctx, timeout)
			if err := f.Flush(final); err != nil && f.Log != nil {
				// Not tried again: the engine is stopping. Cut short by
				// the Stop's own deadline is what the caller asked for;
				// anything else (its own FinalTimeout, an error) is not.
				level := slog.LevelWarn
				if stopOutOfTime(ctx) {
					level = slog.LevelInfo
				}
				f.Log.Log(context.Background(), level, "gendurable: "+f.Name+" at stop did not finish; what was observed since the last one is not kept", "err", err)
			}
			cancel()
			return
		case <-t.C:
			if ctx.Err() != nil {
				continue // stopping: the final flush comes next
			}
			// Not cut short by a Stop that lands on it (only by the Stop's
			// own deadline): the final flush follows it. Cancelled, it
			// logged a failure "tried again later" of an engine stopping.
			bctx, cancel := StopBoundContext(ctx, orDefault(f.StatementTimeout, DefaultStatementTimeout))
			f.flush(bctx)
			cancel()
		}
	}
}

func (f *Flusher) flush(ctx context.Context) {
	if err := f.Flush(ctx); err != nil && f.Log != nil {
		f.Log.Warn("gendurable: "+f.Name+" failed; it is tried again later", sqlq.ErrAttrs(err)...)
	}
}
