//go:build !linux

package benchrun

import "os"

// IsTerminal reports whether f is a character device, the closest portable
// guess at a terminal (it also takes /dev/null for one).
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
