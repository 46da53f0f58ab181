package benchrun

import (
	"os"
	"syscall"
	"unsafe"
)

// IsTerminal reports whether f is a terminal: the terminal-attributes ioctl
// succeeds on it. (/dev/null is a character device too, but not a terminal:
// a check of the file mode would take it for one.)
func IsTerminal(f *os.File) bool {
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return errno == 0
}
