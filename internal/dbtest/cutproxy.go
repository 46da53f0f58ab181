package dbtest

import (
	"io"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// CutProxy is a loopback TCP proxy to a database server that can cut the
// network under its connections the way a partition does: after Cut, no
// byte goes through in either direction, yet no socket is closed — neither
// the client nor the server learns that the other side is gone, and the
// server keeps each session (and its open transaction, and its locks) until
// something on the server ends it. Connections opened after Cut hang the
// same way. Heal lets traffic through again, as a partition that ends does:
// what was sent meanwhile arrives late, in order (nothing is dropped, as
// TCP would retransmit it). Strand cuts only the connections open at the
// time, for good, as a NAT or a load balancer that forgets them does: new
// connections go through. Close ends everything; it is registered with
// t.Cleanup.
type CutProxy struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	conns []net.Conn
	links []chan struct{} // of the connections not stranded: closed by Strand
	open  chan struct{}   // closed while traffic flows; replaced by Cut
	done  chan struct{}   // closed by Close
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
	open := make(chan struct{})
	close(open)
	p := &CutProxy{ln: ln, upstream: upstream, open: open, done: make(chan struct{})}
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

// Cut stops all traffic through the proxy until Heal.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default: // already cut
	}
}

// Heal lets traffic through again after Cut.
func (p *CutProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// Strand stops, for good, all traffic of the connections open now (those
// Close has not ended), without closing anything: neither side learns that
// the other is gone, and what either sends is never delivered. Connections
// opened after Strand are not affected.
func (p *CutProxy) Strand() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		close(l)
	}
	p.links = nil
}

// link registers a new connection for Strand.
func (p *CutProxy) link() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := make(chan struct{})
	p.links = append(p.links, l)
	return l
}

// flowing returns a channel that is closed while traffic may flow.
func (p *CutProxy) flowing() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// wait blocks until traffic may flow; false once the proxy is closed.
func (p *CutProxy) wait() bool {
	select {
	case <-p.flowing():
		return true
	case <-p.done:
		return false
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
		stranded := p.link()
		go func() {
			if !p.wait() { // a connection opened during a cut reaches the server once it heals
				return
			}
			up, err := net.Dial("tcp", p.upstream)
			if err != nil {
				_ = down.Close()
				return
			}
			if !p.track(up) {
				return
			}
			go p.pipe(up, down, stranded)
			p.pipe(down, up, stranded)
		}()
	}
}

// pipe copies from src to dst, holding what it read during a cut until
// the cut heals. A side that closes closes the other — once the cut has
// healed: during a partition the other side learns nothing. Once stranded
// is closed, nothing more crosses, and nothing is closed, until Close.
func (p *CutProxy) pipe(dst io.WriteCloser, src io.Reader, stranded chan struct{}) {
	buf := make([]byte, 32<<10)
	pass := func() bool {
		select {
		case <-stranded:
			<-p.done
			return false
		default:
		}
		select {
		case <-p.flowing():
			return true
		case <-stranded:
			<-p.done
			return false
		case <-p.done:
			return false
		}
	}
	for {
		if !pass() {
			return
		}
		n, err := src.Read(buf)
		if !pass() { // read as the cut came: it crosses when the cut heals
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// PoolConfig is a pool configuration for url that reaches its server
// through the proxy. It has no TLS and no fallbacks: pgx's fallbacks (for
// sslmode=prefer, the default) would name the server itself, and a
// connection could go around the proxy.
func (p *CutProxy) PoolConfig(t testing.TB, url string) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	return cfg
}

// NewCutProxyFor is NewCutProxy to the server of url (its first host).
func NewCutProxyFor(t testing.TB, url string) *CutProxy {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return NewCutProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
}
