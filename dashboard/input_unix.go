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

// awaitInput waits until bytes wait unread in c's socket, or its peer has
// closed it, without taking them: true then, or false at once where it
// cannot look (c is no socket). It waits as c's Read does, under its read
// deadline; an error is a read's (net/http takes a deadline's, or that of
// a connection closed meanwhile, for the common end of a connection).
//
// Only a connection of the net package's own (TCP, a Unix socket) is
// looked at: one of another type that is a syscall.Conn all the same (a
// wrapper embedding a *net.TCPConn) may hold bytes it read ahead, which
// the socket no longer has, and waiting for more held its request until
// its header timeout, unanswered (a review: a listener that sniffs the
// first bytes at Accept and replays them).
func awaitInput(c net.Conn) (bool, error) {
	var sc syscall.Conn
	switch c := c.(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		sc = c
	default:
		return false, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, nil
	}
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		for {
			_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
			switch err {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // nothing yet: wait until readable
			}
			return true // bytes, the end (0 bytes) or an error: Read takes it
		}
	})
	if oe, ok := err.(*net.OpError); ok {
		e := *oe
		e.Op = "read" // not "raw-read"
		err = &e
	}
	return true, err
}
