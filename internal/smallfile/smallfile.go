// Package smallfile reads files that hold one short value — a credential,
// a rate — named by an operator: only a regular file, and only up to a
// bound.
package smallfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// ErrTooLarge: the file is longer than the bound given to Read.
var ErrTooLarge = errors.New("longer than its bound")

// ErrNotRegular: the name is not a regular file (a FIFO, a device, a
// directory).
var ErrNotRegular = errors.New("not a regular file")

// Read reads name, a regular file of at most max bytes. Anything else is an
// error, before more than max+1 bytes are read: /dev/zero would otherwise be
// read until memory ran out, and opening a FIFO blocks until something
// writes to it (the open here does not block; the file is refused).
func Read(name string, max int) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w", name, ErrNotRegular)
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	switch {
	case err != nil:
		return nil, err
	case len(b) > max:
		return nil, fmt.Errorf("%s: %w (%d bytes)", name, ErrTooLarge, max)
	}
	return b, nil
}
