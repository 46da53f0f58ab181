package dbtest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// CutProxy is a loopback TCP proxy to a database server that can cut the
// network under its connections the way a partition does: after Cut, no
// byte goes through in either direction, yet no socket is closed — neither
// the client nor the server learns that the other side is gone, and the
// server keeps each session (and its open transaction, and its locks) until
// something on the server ends it. Connections opened after Cut hang the
// same way. Close ends everything; it is registered with t.Cleanup.
type CutProxy struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	conns []net.Conn
	cut   chan struct{} // closed by Cut
	done  chan struct{} // closed by Close
	once  sync.Once
}

// NewCutProxy listens on a free loopback port and forwards every
// connection to upstream (host:port).
func NewCutProxy(t testing.TB, upstream string) *CutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &CutProxy{ln: ln, upstream: upstream, cut: make(chan struct{}), done: make(chan struct{})}
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

// Cut stops all traffic through the proxy, for good.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.cut:
	default:
		close(p.cut)
	}
}

// Close closes the listener and every connection (both sides see them end).
func (p *CutProxy) Close() {
	p.once.Do(func() {
		close(p.done)
		_ = p.ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
}

func (p *CutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		_ = c.Close()
		return false
	default:
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *CutProxy) accept() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(down) {
			return
		}
		go func() {
			select { // a connection opened after the cut never reaches the server
			case <-p.cut:
				<-p.done
				return
			default:
			}
			up, err := net.Dial("tcp", p.upstream)
			if err != nil {
				_ = down.Close()
				return
			}
			if !p.track(up) {
				return
			}
			go p.pipe(up, down)
			p.pipe(down, up)
		}()
	}
}

// pipe copies from src to dst until the cut, then holds both open until
// Close. Before the cut, a side that closes closes the other.
func (p *CutProxy) pipe(dst io.WriteCloser, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.cut:
			<-p.done // what was read is dropped: nothing crosses a partition
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close() // one side closed before any cut: so does the other
			return
		}
	}
}
