//go:build !unix

package dashboard

import "net"

// inputWaiting cannot tell here: every idle or new connection may be
// closed to make room once past its grace.
func inputWaiting(net.Conn) bool { return false }

// awaitInput cannot look here: it returns at once.
func awaitInput(net.Conn) (bool, error) { return false, nil }
