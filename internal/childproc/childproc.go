//go:build linux

// Package childproc holds the child-process plumbing shared by the test
// helpers that run PostgreSQL tools (internal/pgtemp, internal/pgbouncer):
// starting a child so that its parent-death signal works, the child's
// environment, an unprivileged user and a directory it can reach when
// running as root, and a buffer keeping the tail of the child's output.
//
// Errors are returned without a package prefix; callers add their own.
//
// The package is Linux-only (it relies on Linux process attributes).
package childproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// TailBytes is how much of a child's output a [Tail] keeps.
const TailBytes = 16 << 10

// Process is a started child and its exit status.
type Process struct {
	Cmd  *exec.Cmd
	Out  *Tail
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // Wait's result; read only after done is closed
}

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the result of the process's Wait; call it only after [Process.Done]
// is closed.
func (p *Process) Err() error { return p.err }

// Start starts cmd and reaps it in the background; out is kept with the
// process for error messages (cmd's output should be written to it).
//
// Pdeathsig is delivered when the thread that forked the child exits, not the
// process (https://go.dev/issue/27505). So the fork happens on a goroutine
// locked to its OS thread, which then stays busy waiting for the child until
// it exits.
func Start(cmd *exec.Cmd, out *Tail) (*Process, error) {
	p := &Process{Cmd: cmd, Out: out, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// Env is our environment minus PG* variables (PGDATA, PGPORT, ...), which
// could redirect the PostgreSQL tools, with a C locale for predictable
// messages.
func Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_ALL=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// UnprivilegedCredential resolves the user to run a child as when root:
// name, or if it is empty the first of defaults that exists and is not
// uid 0. The error joins the reasons each candidate was rejected.
func UnprivilegedCredential(name string, defaults ...string) (*syscall.Credential, error) {
	names := []string{name}
	if name == "" {
		names = defaults
	}
	var errs []error
	for _, n := range names {
		u, err := user.Lookup(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			errs = append(errs, fmt.Errorf("user %s has non-numeric uid/gid %s/%s", n, u.Uid, u.Gid))
			continue
		}
		if uid == 0 {
			errs = append(errs, fmt.Errorf("user %s has uid 0", n))
			continue
		}
		// Groups is empty: the child drops root's supplementary groups.
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	if len(errs) == 0 {
		return nil, errors.New("no user names given")
	}
	return nil, errors.Join(errs...)
}

// MakeDir creates a directory with os.MkdirTemp (pattern as there), owned
// by cred's user if cred is not nil. That user must be able to reach it, so
// with a cred it goes under os.TempDir only if that user may traverse it
// (e.g. not TMPDIR=/root/tmp), else under /tmp. It goes under /tmp too when
// os.TempDir's path is too long for a Unix socket in it (a server's
// ".s.PGSQL.5432"): the kernel takes at most 107 bytes, and postgres
// failed to start under a long TMPDIR (a newcomer's probe).
func MakeDir(pattern string, cred *syscall.Credential) (string, error) {
	parent := os.TempDir()
	if len(parent)+len(pattern)+len("/0123456789/.s.PGSQL.65535") > maxSocketPath {
		parent = "/tmp"
	}
	if cred != nil && !traversable(parent, cred) {
		if !traversable("/tmp", cred) {
			return "", fmt.Errorf("neither %s nor /tmp is accessible to uid %d", parent, cred.Uid)
		}
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, pattern)
	if err != nil {
		return "", err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("preparing %s: %w", dir, err)
		}
	}
	return dir, nil
}

// maxSocketPath is the longest path a Unix socket may have on Linux
// (sun_path holds 108 bytes, its last a NUL).
const maxSocketPath = 107

// traversable reports whether the user in cred may search dir and all its
// ancestors (ignoring ACLs).
func traversable(dir string, cred *syscall.Credential) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil || !fi.IsDir() {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		var bit os.FileMode
		switch {
		case st.Uid == cred.Uid:
			bit = 0o100
		case st.Gid == cred.Gid:
			bit = 0o010
		default:
			bit = 0o001
		}
		if fi.Mode().Perm()&bit == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// Tail is an io.Writer that keeps the last [TailBytes] written to it. It is
// safe for concurrent use; the zero value is ready to use.
type Tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - TailBytes; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// String returns the output kept.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// Quote renders the last maxLines lines of the output of the program named
// what, for appending to an error message.
func (t *Tail) Quote(what string, maxLines int) string {
	s := strings.TrimRight(t.String(), "\n")
	if s == "" {
		return " (no output from " + what + ")"
	}
	lines := strings.Split(s, "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return "\n--- last output of " + what + " ---\n" + strings.Join(lines, "\n")
}
