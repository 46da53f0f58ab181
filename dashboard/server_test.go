package dashboard_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// serve runs h on a loopback port with NewServer and LimitListener, and
// counts the connections the server holds open (live) and the most at once
// (peak); it stops at cleanup.
func serve(t *testing.T, h http.Handler, o dashboard.ServerOptions) (addr string, live, peak *atomic.Int64) {
	t.Helper()
	srv := dashboard.NewServer(h, o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cl := &countingListener{Listener: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(dashboard.LimitListener(cl, o.MaxConns))
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return ln.Addr().String(), &cl.live, &cl.peak
}

// countingListener counts the connections it accepted and that are not
// closed yet.
type countingListener struct {
	net.Listener
	live, peak atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	n := l.live.Add(1)
	for p := l.peak.Load(); n > p && !l.peak.CompareAndSwap(p, n); p = l.peak.Load() {
	}
	return &countedConn{Conn: c, l: l}, nil
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.live.Add(-1) })
	return c.Conn.Close()
}

// TestConnectionsAreBoundedAndTimedOut is the attack: 300 sockets
// that send GET / and idle after the 401, and 300 that announce a 100000
// byte POST body and never send it, against a server with token and basic
// auth. Every one is closed within the timeouts (the unauthenticated ones
// right after their 401, without the body being read), the server never
// holds more than MaxConns connections, and authenticated clients that
// idle, trickle nothing, or send no request are cut off by the idle, read
// and header timeouts.
func TestConnectionsAreBoundedAndTimedOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{BearerToken: "a-token-of-some-length",
		BasicAuth: &dashboard.BasicAuth{User: "ops", Password: "pw"}})
	o := dashboard.ServerOptions{ReadHeaderTimeout: 2 * time.Second, ReadTimeout: 3 * time.Second,
		WriteTimeout: 5 * time.Second, IdleTimeout: 3 * time.Second, MaxHeaderBytes: 4 << 10, MaxConns: 50}
	addr, live, peak := serve(t, h, o)

	const auth = "Authorization: Bearer a-token-of-some-length\r\n"
	kinds := []struct {
		name, request string
		n             int
		status        int  // the answer's status, 0 for none
		prompt        bool // closed right after the answer, not by a timeout
	}{
		{"unauthenticated GET, then idle", "GET / HTTP/1.1\r\nHost: " + addr + "\r\n\r\n", 300, 401, true},
		{"unauthenticated POST, body never sent", "POST /queues/x/pause HTTP/1.1\r\nHost: " + addr +
			"\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n", 300, 401, true},
		{"authenticated GET, then idle", "GET /static/style.css HTTP/1.1\r\nHost: " + addr + "\r\n" + auth + "\r\n", 20, 200, false},
		{"authenticated POST, body never sent", "POST /queues/x/pause HTTP/1.1\r\nHost: " + addr + "\r\n" + auth +
			"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n", 20, 400, false},
		{"connect and send nothing", "", 20, 0, false},
		{"oversized headers", "GET / HTTP/1.1\r\nHost: " + addr + "\r\nX-Pad: " + strings.Repeat("p", 8<<10) + "\r\n\r\n", 20, 431, true},
	}
	// Every socket must be closed by the server well within this: a slow
	// one holds a slot for about a timeout (60 of them over 50 slots), a
	// refused one for the server's 500ms linger after its answer.
	deadline := time.Now().Add(30 * time.Second)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for _, k := range kinds {
		for range k.n {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(deadline)
				if k.request != "" {
					if _, err := io.WriteString(c, k.request); err != nil {
						errs <- fmt.Errorf("%s: write: %w", k.name, err)
						return
					}
				}
				br := bufio.NewReader(c)
				if k.status != 0 {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						errs <- fmt.Errorf("%s: no answer: %w", k.name, err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != k.status {
						errs <- fmt.Errorf("%s: answered %d, want %d", k.name, resp.StatusCode, k.status)
					}
				}
				answered := time.Now()
				// Read until the server closes the connection.
				_, err := io.ReadAll(br)
				var ne net.Error
				switch {
				case errors.As(err, &ne) && ne.Timeout():
					errs <- fmt.Errorf("%s: still open after %s", k.name, time.Since(start))
				case err != nil && !strings.Contains(err.Error(), "reset"):
					errs <- fmt.Errorf("%s: read: %w", k.name, err)
				case k.prompt && time.Since(answered) > o.IdleTimeout/2:
					errs <- fmt.Errorf("%s: closed %s after the answer, want at once (no body read, no idling)", k.name, time.Since(answered))
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("660 sockets closed by the server in %s; at most %d open at once", time.Since(start).Round(time.Millisecond), peak.Load())
	require.LessOrEqual(t, peak.Load(), int64(o.MaxConns), "the server never held more than MaxConns connections")
	require.Eventually(t, func() bool { return live.Load() == 0 }, 2*time.Second, 10*time.Millisecond)
	require.False(t, e.queuePaused("x"), "no unauthenticated pause got through")
}

// TestNewServerDefaults: NewServer sets every bound, and its defaults are
// the documented ones.
func TestNewServerDefaults(t *testing.T) {
	t.Parallel()
	srv := dashboard.NewServer(http.NotFoundHandler(), dashboard.ServerOptions{})
	require.Equal(t, dashboard.DefaultReadHeaderTimeout, srv.ReadHeaderTimeout)
	require.Equal(t, dashboard.DefaultReadTimeout, srv.ReadTimeout)
	require.Equal(t, dashboard.DefaultWriteTimeout, srv.WriteTimeout)
	require.Greater(t, srv.WriteTimeout, dashboard.DefaultRequestTimeout)
	require.Equal(t, dashboard.DefaultIdleTimeout, srv.IdleTimeout)
	require.Equal(t, dashboard.DefaultMaxHeaderBytes, srv.MaxHeaderBytes)

	// Closing a LimitListener wakes an Accept that waits for a free slot.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ll := dashboard.LimitListener(ln, 1)
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	held, err := ll.Accept()
	require.NoError(t, err)
	defer held.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		_, err := ll.Accept()
		accepted <- err
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, ll.Close())
	select {
	case err := <-accepted:
		require.ErrorIs(t, err, net.ErrClosed)
	case <-ctx.Done():
		t.Fatal("Accept still blocked after Close")
	}
}

// TestFullListenerMakesRoomForNewClients is the review's attack: a client
// fills every slot of LimitListener with connections that send nothing or
// idle after an answer, and keeps reconnecting as they are closed. Other
// clients still get their answers at once (not after the header or idle
// timeout, here 30 s and 60 s), the server never holds more than MaxConns
// connections, and a request under way — a POST whose body is still
// coming — is not closed to make room: it gets its answer.
func TestFullListenerMakesRoomForNewClients(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{BearerToken: "a-token-of-some-length"})
	o := dashboard.ServerOptions{ReadHeaderTimeout: 30 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second, MaxConns: 4}
	addr, _, peak := serve(t, h, o)
	const auth = "Authorization: Bearer a-token-of-some-length\r\n"

	// A request under way: its header read, its body trickling.
	slow, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer slow.Close()
	_, err = io.WriteString(slow, "POST /queues/x/pause HTTP/1.1\r\nHost: "+addr+"\r\n"+auth+
		"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 6\r\n\r\nab")
	require.NoError(t, err)

	// The attacker: the other slots, held by connections that idle after an
	// answer and by ones that send nothing, reopened as soon as closed.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				go func() { <-ctx.Done(); c.Close() }()
				if i%2 == 0 { // keep-alive: one answer, then idle
					_, _ = io.WriteString(c, "GET /static/style.css HTTP/1.1\r\nHost: "+addr+"\r\n"+auth+"\r\n")
				}
				_, _ = io.Copy(io.Discard, c) // until the server closes it
				c.Close()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // every slot taken

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range 5 {
		start := time.Now()
		req, err := http.NewRequest("GET", "http://"+addr+"/static/style.css", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer a-token-of-some-length")
		resp, err := client.Do(req)
		require.NoError(t, err, "a client got no answer while the attacker held the slots")
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Less(t, time.Since(start), 3*time.Second, "answered after %s", time.Since(start))
	}

	// The request under way was left alone: its body completes, it is answered.
	_, err = io.WriteString(slow, "cdef")
	require.NoError(t, err)
	_ = slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
	require.NoError(t, err, "the request under way was closed to make room")
	resp.Body.Close()
	require.NotZero(t, resp.StatusCode)
	require.LessOrEqual(t, peak.Load(), int64(o.MaxConns), "the server never held more than MaxConns connections")
}

// TestLingeringConnectionEndsWithItsAnswer: the server half-closes a
// connection after its last answer when it lingers before closing it (a
// 413 to a POST whose body is over the bound, here), so the client sees the
// end of it at once, not after net/http's 500 ms linger (LimitListener's
// connections hid CloseWrite from the server); and a full listener takes
// the slot of such a lingering connection back at once for the next
// client.
//
// Each half is deterministic. The first serves through a listener with
// room to spare, so nothing is closed to make room, and holds the server's
// own close of the connection until the end of the test: the end of the
// answer the client reads can only be the half-close. The second drives
// LimitListener with the state changes NewServer's server reports, and
// never closes the lingering connection itself: the next Accept returns
// only if the listener takes its slot back. (The test used to send its
// request through a full listener of one slot, which closes a connection
// that has sent no whole request header after 100 ms: under load the
// client, which dialled before it built its 2 MiB request, was cut off
// mid-request, "broken pipe" or "connection reset by peer". The end of the
// answer it saw came from that listener closing the lingering connection,
// not from the half-close, which the test's counting listener hid; and its
// second half passed whether the slot was taken back or freed by the
// server's close 500 ms later.)
func TestLingeringConnectionEndsWithItsAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{BearerToken: "a-token-of-some-length"})
	srv := dashboard.NewServer(h, dashboard.ServerOptions{ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second})
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := tcp.Addr().String()
	held := &heldCloseListener{Listener: tcp, release: make(chan struct{})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(dashboard.LimitListener(held, 0))
	}()
	defer func() {
		close(held.release)
		_ = srv.Close()
		<-served
	}()

	body := strings.Repeat("a", dashboard.MaxFormBytes+1)
	request := "POST /queues/x/pause HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer a-token-of-some-length" +
		"\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.WriteString(c, request)
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	_, err = io.ReadAll(br)
	require.NoError(t, err, "the end of the answer came while the server still held the connection open: its half-close")

	// A full listener of one slot, held by a connection with a request
	// under way: Accept waits. Once that connection's answer was its last
	// and it lingers (CloseWrite), its slot is taken back.
	_, s1, accepted := fullOneSlotListener(t, srv, nil, http.StateNew, http.StateActive)
	select {
	case s2 := <-accepted:
		s2.Close()
		t.Fatal("a connection with a request under way was closed to make room")
	case <-time.After(200 * time.Millisecond):
	}
	cw, ok := s1.(interface{ CloseWrite() error })
	require.True(t, ok, "LimitListener's connections pass CloseWrite on")
	require.NoError(t, cw.CloseWrite())
	select {
	case s2 := <-accepted:
		s2.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the lingering connection's slot was not taken back for the next client")
	}
}

// heldCloseListener hands the server connections that pass CloseWrite on
// to the TCP connection and whose Close waits until release is closed.
type heldCloseListener struct {
	net.Listener
	release chan struct{}
}

func (l *heldCloseListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &heldCloseConn{Conn: c, release: l.release}, nil
}

type heldCloseConn struct {
	net.Conn
	release chan struct{}
}

func (c *heldCloseConn) CloseWrite() error { return c.Conn.(*net.TCPConn).CloseWrite() }

func (c *heldCloseConn) Close() error {
	<-c.release
	return c.Conn.Close()
}

// TestFullListenerKeepsARequestNotYetRead: a full listener closes a
// connection that has sent nothing for 100 ms to make room, but not one
// whose request has arrived and waits unread in its socket — the server's
// goroutine for it has not run yet, as on a busy CPU. Closing it lost a
// request the client had sent in full: `seq 1 400 | xargs -P 200 -I{} curl
// …/instances/1` (a 2.5 MB page, `gendurable ui` with its 128 connections,
// two cores) got 4–9 resets in four rounds before, 0–1 after. Driven as
// TestLingeringConnectionEndsWithItsAnswer drives it: the states NewServer's
// server reports, and nothing reading the connections.
func TestFullListenerKeepsARequestNotYetRead(t *testing.T) {
	t.Parallel()
	srv := dashboard.NewServer(http.NotFoundHandler(), dashboard.ServerOptions{})
	for _, sent := range []bool{true, false} {
		var request func(c1, s1 net.Conn)
		if sent {
			request = func(c1, _ net.Conn) {
				_, err := io.WriteString(c1, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
				require.NoError(t, err)
			}
		}
		c1, _, accepted := fullOneSlotListener(t, srv, request, http.StateNew)
		select {
		case s2 := <-accepted:
			s2.Close()
			require.False(t, sent, "the connection whose request waited unread was closed to make room")
			_ = c1.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := c1.Read(make([]byte, 1))
			require.ErrorIs(t, err, io.EOF, "the silent connection was closed")
		case <-time.After(1 * time.Second): // ten times the grace
			require.True(t, sent, "a connection silent for 1 s was not closed to make room")
		}
	}
}

// TestFullListenerKeepsARequestWhoseHeaderWasRead: net/http reports a
// connection active only once it has parsed the request header. A full
// listener closed a connection whose reader had taken the whole request
// out of its socket but not yet reported it (its goroutine descheduled
// between the two, on a busy CPU): the handler ran — a dashboard action
// done and audit-logged — and its answer went nowhere (a probe: 18–104 of
// 500 requests at once, load 10–23). Driven as the test above, the server
// side read by the test: a whole header read is kept; part of one, read
// and then silent for longer than the grace, is closed as a silent
// connection is (a client trickling headers holds no slot); and a kept-alive
// connection idle after its answer is closed though its first request's
// header was read.
func TestFullListenerKeepsARequestWhoseHeaderWasRead(t *testing.T) {
	t.Parallel()
	srv := dashboard.NewServer(http.NotFoundHandler(), dashboard.ServerOptions{})
	for _, tc := range []struct {
		name, sent     string
		answered, kept bool
	}{
		{"whole header", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", false, true},
		{"bare newlines", "GET / HTTP/1.1\nHost: x\n\n", false, true},
		{"part of a header", "GET / HTTP/1.1\r\nHost: x\r\n", false, false},
		{"idle after an answer", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Sent and read before the second client dials (the grace runs
			// from then on).
			c1, _, accepted := fullOneSlotListener(t, srv, func(c1, s1 net.Conn) {
				_, err := io.WriteString(c1, tc.sent)
				require.NoError(t, err)
				buf := make([]byte, len(tc.sent))
				_, err = io.ReadFull(s1, buf) // the server's reader takes it all
				require.NoError(t, err)
				if tc.answered {
					srv.ConnState(s1, http.StateActive)
					srv.ConnState(s1, http.StateIdle)
				}
			}, http.StateNew)
			select {
			case s2 := <-accepted:
				s2.Close()
				require.False(t, tc.kept, "the connection whose request header was read was closed to make room")
				_ = c1.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err := c1.Read(make([]byte, 1))
				require.ErrorIs(t, err, io.EOF, "the connection was closed")
			case <-time.After(1 * time.Second): // ten times the grace
				require.True(t, tc.kept, "a connection without a request under way for 1 s was not closed to make room")
			}
		})
	}
}

// TestFullListenerKeepsARequestItsReaderIsTaking: the reader takes a
// request out of its socket and only then notes it, and a full listener
// looking in between saw no byte waiting and no header read: it closed the
// connection, and the request the reader then held was answered to no one
// (a probe: 300 connections at once, each sending a GET at once, against
// `gendurable ui` with its 128, load 11 — 1–60 of 300 closed with no
// answer, in several of 7 runs; the reader waited for the lock the
// listener held while it looked). Driven by holding the reader there: its
// Read has taken the bytes and does not note them until the listener has
// looked for 1 s.
func TestFullListenerKeepsARequestItsReaderIsTaking(t *testing.T) {
	t.Parallel()
	srv := dashboard.NewServer(http.NotFoundHandler(), dashboard.ServerOptions{})
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	held := &holdingListener{Listener: tcp, taken: make(chan struct{}), release: make(chan struct{})}
	ln := dashboard.LimitListener(tcp, 1)
	dashboard.HoldAfterTake(ln, held.hold)
	t.Cleanup(func() { _ = ln.Close() })
	c1, err := net.Dial("tcp", tcp.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c1.Close() })
	s1, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s1.Close() })
	srv.ConnState(s1, http.StateNew)
	const request = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	_, err = io.WriteString(c1, request)
	require.NoError(t, err)
	read := make(chan string, 1)
	go func() {
		buf := make([]byte, 64)
		n, _ := s1.Read(buf)
		read <- string(buf[:n])
	}()
	select {
	case <-held.taken:
	case <-time.After(5 * time.Second):
		t.Fatal("the reader did not take the request")
	}
	c2, err := net.Dial("tcp", tcp.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c2.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if s2, err := ln.Accept(); err == nil {
			accepted <- s2
		}
	}()
	select {
	case s2 := <-accepted:
		s2.Close()
		t.Error("the connection whose reader was taking its request was closed to make room")
	case <-time.After(1 * time.Second): // ten times the grace
	}
	close(held.release)
	require.Equal(t, request, <-read)
}

// holdingListener holds a Read that took bytes (hold, by HoldAfterTake)
// until release is closed, having closed taken.
type holdingListener struct {
	net.Listener
	once           sync.Once
	taken, release chan struct{}
}

func (l *holdingListener) hold() {
	l.once.Do(func() { close(l.taken) })
	<-l.release
}

// TestAListenerWhoseConnectionsReadAheadIsAnswered (a review): a wrapped
// listener whose connections hold bytes they read ahead (a sniffer that
// reads the first bytes at Accept and replays them), a *net.TCPConn
// embedded all the same. Waiting for bytes in the socket before a Read held
// its request, already read, until the header timeout: closed unanswered
// after 3 s.
func TestAListenerWhoseConnectionsReadAheadIsAnswered(t *testing.T) {
	t.Parallel()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := dashboard.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }),
		dashboard.ServerOptions{ReadHeaderTimeout: 3 * time.Second})
	go func() { _ = srv.Serve(dashboard.LimitListener(sniffListener{tcp}, 4)) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := net.Dial("tcp", tcp.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	start := time.Now()
	_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 200 OK\r\n", line)
	require.Less(t, time.Since(start), 2*time.Second, "answered at once, not at the header timeout")
}

// sniffListener reads the first bytes of each connection at Accept and
// hands back a connection that replays them.
type sniffListener struct{ net.Listener }

type sniffConn struct {
	*net.TCPConn
	buf []byte
}

func (c *sniffConn) Read(p []byte) (int, error) {
	if len(c.buf) > 0 {
		n := copy(p, c.buf)
		c.buf = c.buf[n:]
		return n, nil
	}
	return c.TCPConn.Read(p)
}

func (l sniffListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	b := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, _ := c.Read(b) // the whole small request
	_ = c.SetReadDeadline(time.Time{})
	return &sniffConn{TCPConn: c.(*net.TCPConn), buf: b[:n]}, nil
}

// fullOneSlotListener serves LimitListener of one slot: a client c1 whose
// server side s1 has reported states to srv's ConnState (after request, if
// not nil, wrote on c1), then a second client dialled; accepted gets the
// connection of the Accept that waits for a slot, if it returns.
func fullOneSlotListener(t *testing.T, srv *http.Server, request func(c1, s1 net.Conn), states ...http.ConnState) (c1, s1 net.Conn, accepted <-chan net.Conn) {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := dashboard.LimitListener(tcp, 1)
	t.Cleanup(func() { _ = ln.Close() })
	c1, err = net.Dial("tcp", tcp.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c1.Close() })
	s1, err = ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s1.Close() })
	for _, st := range states {
		srv.ConnState(s1, st)
	}
	if request != nil {
		request(c1, s1)
	}
	c2, err := net.Dial("tcp", tcp.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c2.Close() })
	ch := make(chan net.Conn, 1)
	go func() {
		if s2, err := ln.Accept(); err == nil {
			ch <- s2
		}
	}()
	return c1, s1, ch
}
