package dashboard

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
)

// shared is a value read from the database that concurrent requests share:
// a read at most ttl old is served as it is; past that, one request reads
// afresh while the others are served the previous value (or, before any
// value exists, wait for that read, each as long as its own context
// allows). So pages that many tabs refresh every few seconds cost one read
// per ttl, not one per request.
type shared[T any] struct {
	mu     sync.Mutex
	at     time.Time
	has    bool
	val    T
	gen    uint64         // bumped by reset: a read begun before it is not kept
	flight *sharedRead[T] // the read under way, nil when none
}

// sharedRead is one read, shared by the requests that wait for it; done is
// closed when val and err are set.
type sharedRead[T any] struct {
	done chan struct{}
	gen  uint64
	val  T
	err  error
}

func (c *shared[T]) get(ctx context.Context, ttl time.Duration, read func(context.Context) (T, error)) (T, error) {
	for {
		c.mu.Lock()
		if c.has && (c.flight != nil || time.Since(c.at) < ttl) {
			v := c.val
			c.mu.Unlock()
			return v, nil
		}
		f := c.flight
		if f == nil {
			f = &sharedRead[T]{done: make(chan struct{}), gen: c.gen}
			c.flight = f
			c.mu.Unlock()
			c.read(ctx, f, read)
			return f.val, f.err
		}
		c.mu.Unlock()
		select {
		case <-f.done:
			if f.err == nil {
				return f.val, nil
			}
			// It failed, perhaps because its request ended: read with ours.
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		}
	}
}

// read makes the read f stands for and publishes its result.
func (c *shared[T]) read(ctx context.Context, f *sharedRead[T], read func(context.Context) (T, error)) {
	finished := false
	defer func() {
		c.mu.Lock()
		switch {
		case !finished:
			f.err = errors.New("dashboard: a shared read did not finish") // it panicked
		case f.err == nil && f.gen == c.gen:
			c.val, c.has, c.at = f.val, true, time.Now()
		}
		if c.flight == f {
			c.flight = nil
		}
		c.mu.Unlock()
		close(f.done)
	}()
	f.val, f.err = read(ctx)
	finished = true
}

// reset forgets the value: the next get reads afresh. An action of this
// dashboard that changed what was read calls it, so its own page after the
// redirect shows the change.
func (c *shared[T]) reset() {
	c.mu.Lock()
	c.has, c.flight = false, nil
	c.gen++
	var zero T
	c.val = zero
	c.mu.Unlock()
}

// graphs are the machine graphs shared between requests, one per machine
// the dashboard knows (so at most as many as engines stored).
type graphs struct {
	mu sync.Mutex
	m  map[string]*shared[*gendurable.MachineGraph]
}

// graphOf is the shared graph of the machine name.
func (d *dashboard) graphOf(name string) *shared[*gendurable.MachineGraph] {
	d.graphs.mu.Lock()
	defer d.graphs.mu.Unlock()
	if d.graphs.m == nil {
		d.graphs.m = map[string]*shared[*gendurable.MachineGraph]{}
	}
	c := d.graphs.m[name]
	if c == nil {
		c = &shared[*gendurable.MachineGraph]{}
		d.graphs.m[name] = c
	}
	return c
}

// resetShared makes the next page of every shared read read afresh: an
// action of this dashboard changed counts, statuses or pause flags.
func (d *dashboard) resetShared() {
	d.queueStats.reset()
	d.graphs.mu.Lock()
	for _, c := range d.graphs.m {
		c.reset()
	}
	d.graphs.mu.Unlock()
}
