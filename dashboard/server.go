package dashboard

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Defaults of ServerOptions: what `gendurable ui` serves with.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = DefaultRequestTimeout + 20*time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultMaxHeaderBytes    = 16 << 10
	DefaultMaxConns          = 128
)

// ServerOptions bound what one client can hold of a server: time to send
// headers and a body, time to read the answer, idle keep-alive time, header
// size, and (with [LimitListener]) open connections. Zero fields take the
// defaults above.
type ServerOptions struct {
	ReadHeaderTimeout time.Duration // default 5s
	ReadTimeout       time.Duration // the whole request, body included; default 30s
	WriteTimeout      time.Duration // default 30s; keep it above Options.RequestTimeout
	IdleTimeout       time.Duration // between requests on a kept-alive connection; default 60s
	MaxHeaderBytes    int           // default 16 KiB
	MaxConns          int           // open connections, for LimitListener; default 128
}

func (o ServerOptions) withDefaults() ServerOptions {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&o.ReadTimeout, DefaultReadTimeout)
	def(&o.WriteTimeout, DefaultWriteTimeout)
	def(&o.IdleTimeout, DefaultIdleTimeout)
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	return o
}

// NewServer returns an http.Server for h with every timeout of o set, so
// a client that connects and then sends nothing, trickles a body, or idles
// after its answer is disconnected. Serve it on [LimitListener] to bound
// the connections too:
//
//	srv := dashboard.NewServer(h, dashboard.ServerOptions{})
//	ln, err := net.Listen("tcp", dashboard.DefaultAddr)
//	...
//	err = srv.Serve(dashboard.LimitListener(ln, 0))
//
// (When you mount the handler in a server of your own, give that server
// the same bounds.) To stop, call srv.Shutdown and wait for it to return,
// not only for Serve (which returns as Shutdown begins): the requests under
// way — a bulk action's batches — are answered and audit-logged by then.
func NewServer(h http.Handler, o ServerOptions) *http.Server {
	o = o.withDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		ReadTimeout:       o.ReadTimeout,
		WriteTimeout:      o.WriteTimeout,
		IdleTimeout:       o.IdleTimeout,
		MaxHeaderBytes:    o.MaxHeaderBytes,
	}
}

// LimitListener returns a listener that holds at most n connections open
// at once (n <= 0: DefaultMaxConns): past that, Accept waits until one
// closes, and further clients wait in the kernel's backlog instead of
// taking a file descriptor each.
func LimitListener(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		n = DefaultMaxConns
	}
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
