//go:build unix

package dashboard

import (
	"net"
	"syscall"
)

// inputWaiting reports whether bytes wait unread in c's socket: a peek
// that neither waits (Go's sockets are non-blocking: an empty one answers
// EAGAIN) nor takes them, and does not take the connection's read lock (a
// reader blocked on it holds that).
func inputWaiting(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	waiting := false
	_ = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		waiting = err == nil && n > 0
	})
	return waiting
}
