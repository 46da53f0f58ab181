package dbtest

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// CountTracer is a statement tracer (Options.Tracer) counting the
// statements whose SQL holds Marker.
type CountTracer struct {
	Marker string
	N      atomic.Int64
}

func (c *CountTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, c.Marker) {
		c.N.Add(1)
	}
	return ctx
}

func (c *CountTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
