package dashboard

import "net"

// HoldAfterTake makes the connections of ln, a LimitListener, call f in a
// Read that waits for a request, after it took bytes from the socket and
// before it notes them: where a full listener once closed a request no one
// answered.
func HoldAfterTake(ln net.Listener, f func()) { ln.(*limitListener).afterTake = f }
