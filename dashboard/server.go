package dashboard

import (
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/gendurable/gendurable"
)

// Defaults of ServerOptions: what `gendurable ui` serves with.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	// DefaultWriteTimeout covers a request's work (DefaultRequestTimeout),
	// the grace a bulk statement under way at its deadline has to finish
	// (gendurable.BulkStatementGrace), and 5 s to render and send.
	DefaultWriteTimeout   = DefaultRequestTimeout + gendurable.BulkStatementGrace + 5*time.Second
	DefaultIdleTimeout    = 60 * time.Second
	DefaultMaxHeaderBytes = 16 << 10
	DefaultMaxConns       = 128
)

// ServerOptions bound what one client can hold of a server: time to send
// headers and a body, time to read the answer, idle keep-alive time, header
// size, and (with [LimitListener]) open connections. Zero fields take the
// defaults above.
type ServerOptions struct {
	ReadHeaderTimeout time.Duration // default 5s
	ReadTimeout       time.Duration // the whole request, body included; default 30s
	WriteTimeout      time.Duration // default 30s; keep it above Options.RequestTimeout + gendurable.BulkStatementGrace
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
		ConnState:         connState, // a full LimitListener closes idle connections to make room
	}
}

// evictGrace is how long a connection must have been idle (kept alive
// after an answer) or new (accepted, its request header not yet read)
// before a full [LimitListener] may close it to make room: a client's
// request normally follows its connection within milliseconds, and a
// keep-alive connection is often reused at once for the next asset.
const evictGrace = 100 * time.Millisecond

// LimitListener returns a listener that holds at most n connections open
// at once (n <= 0: DefaultMaxConns): past that, Accept waits until one
// closes, and further clients wait in the kernel's backlog instead of
// taking a file descriptor each.
//
// Served by a server from [NewServer], a full listener makes room: it
// closes a connection without a request under way — one lingering after
// its last answer before it closes, else the one waiting longest, idle
// after an answer or open without a whole request header (for 100 ms at
// least; on Unix, for the net package's own TCP and Unix connections, not
// while request bytes wait unread in its socket: its reader has not run
// yet; nor while its reader takes them; nor once its reader has read a
// whole request header, unless pipelined: net/http has not reported the
// request yet; elsewhere, and for a connection of another type — a
// wrapper's, which may hold bytes it read ahead, is not looked into — a
// header read only once its reader has noted it, just after the read) —
// so that a client holding many connections open and silent, or idling
// many keep-alives, cannot starve the others. Connections with a request
// being read or answered are never closed; only when every one
// has a request under way does Accept wait. (Under a server of your own,
// set its ConnState to the one NewServer sets, or connections are never
// closed to make room.)
func LimitListener(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		n = DefaultMaxConns
	}
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{}),
		wake: make(chan struct{}, 1), conns: map[*limitConn]struct{}{}}
}

type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	wake      chan struct{} // a connection became idle or new

	mu    sync.Mutex
	conns map[*limitConn]struct{} // open, with their states

	// afterTake, if set (tests only), runs in a waiting connection's Read
	// between taking bytes from the socket and noting them.
	afterTake func()
}

func (l *limitListener) Accept() (net.Conn, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case l.sem <- struct{}{}:
			return l.accept()
		case <-l.done:
			return nil, net.ErrClosed
		default:
		}
		// Full: close the connection waiting longest without a request,
		// or wait for one to close, become idle or pass its grace.
		retry, evicted := l.evict(time.Now())
		if evicted {
			continue
		}
		var after <-chan time.Time
		if retry > 0 {
			if timer == nil {
				timer = time.NewTimer(retry)
			} else {
				timer.Reset(retry)
			}
			after = timer.C
		}
		select {
		case l.sem <- struct{}{}:
			return l.accept()
		case <-l.wake:
		case <-after:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
}

// accept takes the next connection once a slot is held.
func (l *limitListener) accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	lc := &limitConn{Conn: c, l: l, state: stateUnknown}
	l.mu.Lock()
	l.conns[lc] = struct{}{}
	l.mu.Unlock()
	return lc, nil
}

// evict closes the open connection that has waited longest without a
// request under way, if one has for evictGrace; otherwise it says how long
// until one may have (0: none may, until a connection changes state).
//
// A connection whose request has arrived but not been read yet (bytes wait
// in its socket: the server's goroutine for it has not run since, as on a
// busy CPU) has a request under way and is passed over: closing it lost a
// whole request the client had sent (an empty reply). So is one whose
// whole request header its reader has read but not yet reported (net/http
// marks a connection active only once it has parsed the header): closing
// it there let the handler run — an action done and audit-logged — while
// its answer went nowhere (a probe: 18–104 of 500 requests at once on a
// busy CPU). Its reader reports it active, or the server closes it, soon.
// So is one whose reader is taking bytes out of its socket (on Unix: it
// waits for them without taking them, and marks itself taking, before it
// reads): a reader that had taken the request and not yet noted it, waiting
// for the lock held here, was seen with no byte waiting and no header read,
// and closed (a probe: 1–60 of 300 requests at once, load 11).
// Only bytes read while the connection waits for a request are looked at:
// a next request a client pipelined, read along with the one before, is
// not seen (browsers do not pipeline).
func (l *limitListener) evict(now time.Time) (retry time.Duration, evicted bool) {
	l.mu.Lock()
	var cands []*limitConn
	for c := range l.conns {
		if c.state == http.StateNew || c.state == http.StateIdle || c.state == stateLingering {
			cands = append(cands, c)
		}
	}
	slices.SortFunc(cands, func(a, b *limitConn) int { return a.since.Compare(b.since) })
	var victim *limitConn
	for _, c := range cands {
		if wait := c.since.Add(evictGrace).Sub(now); wait > 0 { // a lingering connection's since is zero: never waited for
			if retry == 0 || wait < retry {
				retry = wait
			}
			break
		}
		if c.state != stateLingering && (c.headerRead || c.taking || inputWaiting(c.Conn)) {
			retry = pendingRecheck // its reader will take it up: look again soon
			continue
		}
		victim = c
		break
	}
	if victim == nil {
		l.mu.Unlock()
		return retry, false
	}
	delete(l.conns, victim) // no longer a candidate, whatever it reports now
	l.mu.Unlock()
	_ = victim.Close() // frees its slot; the server's reader sees it closed
	return 0, true
}

// pendingRecheck is how soon a full listener looks again when its only
// candidates have a request waiting to be read.
const pendingRecheck = 10 * time.Millisecond

// connState records a connection's state (http.Server.ConnState).
func connState(c net.Conn, s http.ConnState) {
	lc, ok := c.(*limitConn)
	if !ok {
		return
	}
	l := lc.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, open := l.conns[lc]; !open {
		return
	}
	switch s {
	case http.StateClosed, http.StateHijacked:
		delete(l.conns, lc) // a hijacked one is the handler's: never closed here
		return
	}
	lc.state, lc.since = s, time.Now()
	lc.headerRead, lc.lineStart = false, false // a new request's header, from its first byte
	if s == http.StateNew || s == http.StateIdle {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// stateUnknown: no ConnState reported (a server not from NewServer): the
// connection is never closed to make room. stateLingering: the server
// answered for the last time and half-closed it (CloseWrite); it waits a
// moment before it closes (net/http's 500 ms against a reset losing the
// answer), a slot a full listener may take back at once.
const (
	stateUnknown   http.ConnState = -1
	stateLingering http.ConnState = -2
)

type limitConn struct {
	net.Conn
	l     *limitListener
	once  sync.Once
	state http.ConnState // under l.mu
	since time.Time      // when it entered state
	// headerRead: in state new or idle, the reader has read a whole
	// request header (up to its empty line); lineStart: the bytes read so
	// far end a line; taking: in state new or idle, a Read is taking bytes
	// that wait in the socket, and has not yet noted them. Under l.mu.
	headerRead, lineStart, taking bool
}

// Read notes, while the connection waits for a request (new or idle),
// when the reader has read that request's whole header: from then until
// net/http reports the request active the connection is not closed to
// make room. The bytes of a body (read once it is active) are not looked
// at. A header still arriving is not noted: a client that trickles one is
// closed as before.
//
// While it waits for a request, it first waits (on Unix) for bytes to
// arrive without taking them, and marks itself taking them before it
// does, under l.mu: a full listener sees them waiting in the socket, or
// the mark, or the header read, and never a request taken but not yet
// noted. One it has chosen to close takes nothing.
func (c *limitConn) Read(p []byte) (int, error) {
	l := c.l
	l.mu.Lock()
	waiting := c.state == http.StateNew || c.state == http.StateIdle
	l.mu.Unlock()
	if !waiting {
		return c.Conn.Read(p)
	}
	seen, err := awaitInput(c.Conn)
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	if seen {
		if _, open := l.conns[c]; !open {
			l.mu.Unlock()
			return 0, &net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: net.ErrClosed}
		}
		c.taking = true
	}
	l.mu.Unlock()
	n, err := c.Conn.Read(p)
	if l.afterTake != nil && n > 0 {
		l.afterTake()
	}
	l.mu.Lock()
	c.taking = false
	if n > 0 && (c.state == http.StateNew || c.state == http.StateIdle) && !c.headerRead {
		for _, b := range p[:n] {
			switch b {
			case '\n':
				if c.lineStart {
					c.headerRead = true
				}
				c.lineStart = true
			case '\r':
			default:
				c.lineStart = false
			}
			if c.headerRead {
				break
			}
		}
	}
	l.mu.Unlock()
	return n, err
}

// CloseWrite half-closes the connection, as net/http does after its last
// answer (hiding it made the client wait the server's whole linger for the
// end of the answer), and marks it lingering.
func (c *limitConn) CloseWrite() error {
	var err error
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		err = cw.CloseWrite()
	}
	l := c.l
	l.mu.Lock()
	if _, open := l.conns[c]; open && c.state != stateUnknown {
		c.state, c.since = stateLingering, time.Time{} // first to go
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	l.mu.Unlock()
	return err
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		<-c.l.sem
	})
	return err
}
