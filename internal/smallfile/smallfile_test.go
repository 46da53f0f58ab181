package smallfile

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReadTakesOnlyAShortRegularFile: a regular file within the bound is
// read whole; a longer one, a FIFO (without blocking) and a device are
// refused.
func TestReadTakesOnlyAShortRegularFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ok := filepath.Join(dir, "ok")
	require.NoError(t, os.WriteFile(ok, []byte("250\n"), 0o600))
	b, err := Read(ok, 4)
	require.NoError(t, err)
	require.Equal(t, "250\n", string(b))

	long := filepath.Join(dir, "long")
	require.NoError(t, os.WriteFile(long, bytes.Repeat([]byte("1"), 5), 0o600))
	_, err = Read(long, 4)
	require.ErrorIs(t, err, ErrTooLarge)

	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	done := make(chan error, 1)
	go func() { _, err := Read(fifo, 4); done <- err }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrNotRegular)
	case <-time.After(5 * time.Second):
		t.Fatal("reading a FIFO blocked")
	}
	_, err = Read("/dev/zero", 4)
	require.ErrorIs(t, err, ErrNotRegular)
}
