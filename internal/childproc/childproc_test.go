//go:build linux

package childproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTail(t *testing.T) {
	var tl Tail
	if got := tl.Quote("x", 2); got != " (no output from x)" {
		t.Fatalf("empty Quote = %q", got)
	}
	_, _ = tl.Write([]byte(strings.Repeat("a", TailBytes) + "\nb\nc\nd\n"))
	if n := len(tl.String()); n != TailBytes {
		t.Fatalf("kept %d bytes, want %d", n, TailBytes)
	}
	if got, want := tl.Quote("x", 2), "\n--- last output of x ---\nc\nd"; got != want {
		t.Fatalf("Quote = %q, want %q", got, want)
	}
}

func TestEnv(t *testing.T) {
	t.Setenv("PGDATA", "/nowhere")
	t.Setenv("LC_ALL", "en_US.UTF-8")
	env := Env()
	for _, kv := range env {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_ALL=") && kv != "LC_ALL=C" {
			t.Errorf("Env kept %s", kv)
		}
	}
	if !slices.Contains(env, "LC_ALL=C") {
		t.Error("Env lacks LC_ALL=C")
	}
}

func TestStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{{"true", true}, {"false", false}} {
		bin, err := exec.LookPath(tc.name)
		if err != nil {
			t.Skip(err)
		}
		out := &Tail{}
		cmd := exec.Command(bin)
		cmd.Stdout, cmd.Stderr = out, out
		p, err := Start(cmd, out)
		if err != nil {
			t.Fatal(err)
		}
		<-p.Done()
		if (p.Err() == nil) != tc.ok {
			t.Errorf("%s: Err() = %v", tc.name, p.Err())
		}
	}
	if _, err := Start(exec.Command("/nonexistent/binary"), &Tail{}); err == nil {
		t.Error("Start of a missing binary succeeded")
	}
}

func TestUnprivilegedCredential(t *testing.T) {
	if _, err := UnprivilegedCredential("no-such-user-childproc"); err == nil {
		t.Error("unknown user accepted")
	}
	if _, err := UnprivilegedCredential("", "root"); err == nil || !strings.Contains(err.Error(), "uid 0") {
		t.Errorf("root: err = %v, want uid 0", err)
	}
}

func TestMakeDir(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	dir, err := MakeDir("childproc-", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if !strings.HasPrefix(dir, os.TempDir()) {
		t.Errorf("MakeDir made %s outside %s", dir, os.TempDir())
	}
	cred, err := UnprivilegedCredential("", "nobody")
	if os.Geteuid() != 0 || err != nil {
		return
	}
	dir2, err := MakeDir("childproc-", cred)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir2)
	if fi, err := os.Stat(dir2); err != nil || !traversable(dir2, cred) {
		t.Errorf("%s not reachable by uid %d (%v, %v)", dir2, cred.Uid, fi, err)
	}
}

// TestMakeDirKeepsASocketPathShort: under a TMPDIR too long for a Unix
// socket in the new directory (".s.PGSQL.5432" there), MakeDir goes
// under /tmp: postgres failed to start under such a TMPDIR.
func TestMakeDirKeepsASocketPathShort(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	if err := os.MkdirAll(long, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", long)
	dir, err := MakeDir("pgtemp-", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if socket := filepath.Join(dir, ".s.PGSQL.65535"); len(socket) > maxSocketPath {
		t.Errorf("a socket in %s would have a path of %d bytes", dir, len(socket))
	}
	if !strings.HasPrefix(dir, "/tmp/") {
		t.Errorf("MakeDir made %s, not under /tmp", dir)
	}
}
