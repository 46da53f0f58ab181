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
func awaitInput(c net.Conn) (bool, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
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
