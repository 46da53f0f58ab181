//go:build linux

package pgtemp_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gendurable/gendurable/internal/pgtemp"
)

// requireBinaries skips the test when no PostgreSQL server is installed,
// except under CI (CI is set), where that is a failure.
func requireBinaries(t *testing.T) {
	t.Helper()
	if _, err := pgtemp.FindBinDir(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// start starts a server that is stopped when the test ends.
func start(t *testing.T, ctx context.Context, opts pgtemp.Options) *pgtemp.Server {
	t.Helper()
	requireBinaries(t)
	srv, err := pgtemp.Start(ctx, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return srv
}

func connect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func queryString(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(ctx, sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func portOpen(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// TestLifecycle covers Start, queries, Restart (data survives), Stop (port
// closed, directory gone) and a second Stop.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	requireBinaries(t)
	var log bytes.Buffer
	var logMu sync.Mutex
	srv, err := pgtemp.Start(ctx, pgtemp.Options{Log: lockedWriter{&logMu, &log}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer srv.Stop()

	want := "postgres://postgres@127.0.0.1:" + strconv.Itoa(srv.Port()) + "/postgres?sslmode=disable"
	if srv.URL() != want {
		t.Errorf("URL() = %q, want %q", srv.URL(), want)
	}
	if !strings.HasPrefix(srv.DataDir(), srv.SocketDir()+string(os.PathSeparator)) {
		t.Errorf("DataDir %q is not inside SocketDir %q", srv.DataDir(), srv.SocketDir())
	}

	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	var one int
	if err := conn.QueryRow(ctx, "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("select 1 = %d, %v", one, err)
	}
	for setting, want := range map[string]string{
		"fsync":              "off",
		"synchronous_commit": "off",
		"full_page_writes":   "off",
		"listen_addresses":   "127.0.0.1",
		"server_encoding":    "UTF8",
		"lc_collate":         "C",
	} {
		if got := queryString(t, ctx, conn, "show "+setting); got != want {
			t.Errorf("show %s = %q, want %q", setting, got, want)
		}
	}
	if _, err := conn.Exec(ctx, "create table t (id int primary key, v text); insert into t values (1, 'kept')"); err != nil {
		t.Fatal(err)
	}
	startTime := queryString(t, ctx, conn, "select pg_postmaster_start_time()::text")

	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	// The old session was terminated by the fast shutdown.
	if err := conn.Ping(ctx); err == nil {
		t.Error("old connection still works after Restart")
	}
	conn.Close(ctx)

	conn = connect(t, ctx, srv.URL())
	if got := queryString(t, ctx, conn, "select v from t where id = 1"); got != "kept" {
		t.Errorf("after Restart: v = %q, want kept", got)
	}
	if got := queryString(t, ctx, conn, "select pg_postmaster_start_time()::text"); got == startTime {
		t.Errorf("postmaster start time unchanged after Restart (%s)", got)
	}

	if err := srv.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(srv.SocketDir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s still exists after Stop (stat: %v)", srv.SocketDir(), err)
	}
	if portOpen(srv.Port()) {
		t.Errorf("port %d still open after Stop", srv.Port())
	}
	if err := srv.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := srv.Restart(ctx); !errors.Is(err, pgtemp.ErrStopped) {
		t.Errorf("Restart after Stop = %v, want ErrStopped", err)
	}

	logMu.Lock()
	defer logMu.Unlock()
	for _, s := range []string{"Success", "database system is ready to accept connections", "database system is shut down"} {
		if !strings.Contains(log.String(), s) {
			t.Errorf("log does not contain %q:\n%s", s, log.String())
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestCrashRestart: an immediate shutdown followed by crash recovery keeps
// committed data (synchronous_commit on, so commits are in the WAL).
func TestCrashRestart(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := start(t, ctx, pgtemp.Options{Settings: map[string]string{"synchronous_commit": "on"}})
	conn := connect(t, ctx, srv.URL())
	if _, err := conn.Exec(ctx, "create table t (v text); insert into t values ('committed')"); err != nil {
		t.Fatal(err)
	}
	if err := srv.CrashRestart(ctx); err != nil {
		t.Fatalf("CrashRestart: %v", err)
	}
	conn = connect(t, ctx, srv.URL())
	if got := queryString(t, ctx, conn, "select v from t"); got != "committed" {
		t.Errorf("after CrashRestart: v = %q", got)
	}
}

// TestRestartAfterPostmasterDied: Restart also revives a dead postmaster.
func TestRestartAfterPostmasterDied(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := start(t, ctx, pgtemp.Options{})
	conn := connect(t, ctx, srv.URL())
	pid, err := strconv.Atoi(queryString(t, ctx, conn,
		"select pid::text from pg_stat_activity where backend_type = 'checkpointer'"))
	if err != nil {
		t.Fatal(err)
	}
	// Find the postmaster: the checkpointer's parent.
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	ppid, _ := strconv.Atoi(fields[1])
	// Immediate shutdown behind pgtemp's back.
	if err := syscall.Kill(ppid, syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for portOpen(srv.Port()) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	conn = connect(t, ctx, srv.URL())
	queryString(t, ctx, conn, "select 'alive'")
}

// TestParallelServers: independent servers with their own ports and
// settings, started concurrently.
func TestParallelServers(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	requireBinaries(t)
	var wg sync.WaitGroup
	servers := make([]*pgtemp.Server, 3)
	errs := make([]error, 3)
	for i := range servers {
		wg.Go(func() {
			servers[i], errs[i] = pgtemp.Start(ctx, pgtemp.Options{
				Settings: map[string]string{"max_connections": strconv.Itoa(20 + i), "application_name": "it's \\ pgtemp"},
			})
		})
	}
	wg.Wait()
	ports := map[int]bool{}
	for i, srv := range servers {
		if errs[i] != nil {
			t.Errorf("server %d: %v", i, errs[i])
			continue
		}
		t.Cleanup(func() { _ = srv.Stop() })
		if ports[srv.Port()] {
			t.Errorf("port %d used twice", srv.Port())
		}
		ports[srv.Port()] = true
		conn := connect(t, ctx, srv.URL())
		if got, want := queryString(t, ctx, conn, "show max_connections"), strconv.Itoa(20+i); got != want {
			t.Errorf("server %d: max_connections = %s, want %s", i, got, want)
		}
		if got := queryString(t, ctx, conn, "select setting from pg_file_settings where name = 'application_name' and applied"); got != `it's \ pgtemp` {
			t.Errorf("server %d: application_name = %q", i, got)
		}
		if _, err := conn.Exec(ctx, "create database other"); err != nil {
			t.Fatal(err)
		}
		other := connect(t, ctx, srv.DatabaseURL("other"))
		if got := queryString(t, ctx, other, "select current_database()"); got != "other" {
			t.Errorf("DatabaseURL: connected to %q", got)
		}
	}
}

// TestFixedPort: Options.Port is honoured, and a busy port is an error.
func TestFixedPort(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port

	// Busy: the postmaster cannot bind, and the error says why.
	requireBinaries(t)
	_, err = pgtemp.Start(ctx, pgtemp.Options{Port: port})
	if err == nil || !strings.Contains(err.Error(), "could not bind") {
		t.Errorf("Start on a busy port: err = %v, want a bind error", err)
	}
	t.Logf("busy port: %v", err)

	l.Close()
	srv := start(t, ctx, pgtemp.Options{Port: port})
	if srv.Port() != port || !strings.Contains(srv.URL(), ":"+strconv.Itoa(port)+"/") {
		t.Errorf("Port() = %d, URL() = %s, want port %d", srv.Port(), srv.URL(), port)
	}
	connect(t, ctx, srv.URL())
}

// privateTempDir points $TMPDIR at a fresh directory (traversable by the
// postgres user when running as root) and returns it. The test must not be
// parallel.
func privateTempDir(t *testing.T, perm os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgtemp-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, perm); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", dir)
	return dir
}

// TestStartErrors: failures are reported with the server's own words and
// leave no temporary directory behind. Not parallel: it watches $TMPDIR.
func TestStartErrors(t *testing.T) {
	ctx := testContext(t)
	requireBinaries(t)
	tmp := privateTempDir(t, 0o755)

	_, err := pgtemp.Start(ctx, pgtemp.Options{Settings: map[string]string{"shared_buffers": "lots"}})
	if err == nil || !strings.Contains(err.Error(), `invalid value for parameter "shared_buffers"`) {
		t.Errorf("bad setting: err = %v, want postgres' complaint", err)
	}
	t.Logf("bad setting: %v", err)
	_, err = pgtemp.Start(ctx, pgtemp.Options{Settings: map[string]string{"port": "1"}})
	if err == nil || !strings.Contains(err.Error(), "controlled by pgtemp") {
		t.Errorf("reserved setting: err = %v", err)
	}
	_, err = pgtemp.Start(ctx, pgtemp.Options{BinDir: "/nonexistent/bin"})
	if err == nil || !strings.Contains(err.Error(), "initdb") {
		t.Errorf("bad BinDir: err = %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err = pgtemp.Start(cancelled, pgtemp.Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: err = %v, want context.Canceled", err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err = pgtemp.Start(short, pgtemp.Options{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("short deadline: err = %v, want context.DeadlineExceeded", err)
	}

	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("failed Start left %s behind", e.Name())
	}
}

// TestRootTempDirFallback: as root, an inaccessible $TMPDIR makes pgtemp
// fall back to /tmp instead of failing. Not parallel: it sets $TMPDIR.
func TestRootTempDirFallback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not running as root")
	}
	ctx := testContext(t)
	tmp := privateTempDir(t, 0o700)
	srv := start(t, ctx, pgtemp.Options{})
	if !strings.HasPrefix(srv.SocketDir(), "/tmp/pgtemp-") {
		t.Errorf("SocketDir = %s, want it under /tmp, not %s", srv.SocketDir(), tmp)
	}
}

// TestRootRunsUnprivileged: as root, the cluster belongs to the postgres
// (or chosen) user. Only meaningful when the test runs as root.
func TestRootRunsUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not running as root")
	}
	t.Parallel()
	ctx := testContext(t)
	for _, name := range []string{"", "nobody"} {
		want := name
		if want == "" {
			want = "postgres"
			if _, err := user.Lookup("postgres"); err != nil {
				want = "nobody"
			}
		}
		u, err := user.Lookup(want)
		if err != nil {
			t.Logf("skipping OSUser=%q: %v", name, err)
			continue
		}
		srv := start(t, ctx, pgtemp.Options{OSUser: name})
		fi, err := os.Stat(srv.DataDir())
		if err != nil {
			t.Fatal(err)
		}
		if uid := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)); uid != u.Uid {
			t.Errorf("OSUser=%q: data dir owned by uid %s, want %s (%s)", name, uid, u.Uid, want)
		}
		connect(t, ctx, srv.URL())
	}
	if _, err := pgtemp.Start(ctx, pgtemp.Options{OSUser: "root"}); err == nil || !strings.Contains(err.Error(), "uid 0") {
		t.Errorf("OSUser=root: err = %v", err)
	}
}

// TestKilledParentLeavesNoServer: when the process that started a server is
// SIGKILLed (no chance to call Stop), the postmaster dies with it.
func TestKilledParentLeavesNoServer(t *testing.T) {
	if os.Getenv("PGTEMP_TEST_CHILD") == "1" {
		// Child mode: start a server, report it, wait to be killed.
		srv, err := pgtemp.Start(context.Background(), pgtemp.Options{})
		if err != nil {
			fmt.Println("PGTEMP_CHILD_ERROR", err)
			os.Exit(1)
		}
		fmt.Printf("PGTEMP_CHILD %d %s\n", srv.Port(), srv.SocketDir())
		select {}
	}
	t.Parallel()
	requireBinaries(t)
	child := exec.Command(os.Args[0], "-test.run=^TestKilledParentLeavesNoServer$", "-test.timeout=2m")
	child.Env = append(os.Environ(), "PGTEMP_TEST_CHILD=1")
	child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	child.Stderr = os.Stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	var port int
	var dir string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "PGTEMP_CHILD %d %s", &port, &dir); err == nil {
			break
		}
		t.Log("child:", sc.Text())
	}
	if port == 0 {
		t.Fatal("child did not report a server")
	}
	defer os.RemoveAll(dir) // the documented leftover
	if !portOpen(port) {
		t.Fatalf("child's server on port %d is not up", port)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for portOpen(port) {
		if time.Now().After(deadline) {
			t.Fatalf("postgres on port %d still running 10s after its parent was killed", port)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The port is closed; make sure the postmaster itself is gone too.
	pidFile, err := os.ReadFile(dir + "/data/postmaster.pid")
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	for running(pid) { // it may still be in the middle of exiting
		if time.Now().After(deadline) {
			t.Fatalf("postmaster pid %d still running 10s after its parent was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// running reports whether pid exists and is not a zombie (an orphan zombie
// stays around when PID 1 does not reap, as in some containers).
func running(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

// TestEnv: Options.Env reaches initdb (TZ sets the cluster's default time
// zone) and every start of the postmaster, restarts included.
func TestEnv(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv := start(t, ctx, pgtemp.Options{Env: []string{"TZ=Pacific/Chatham", "GDTEST_MARK=kept"}})
	if got := queryString(t, ctx, connect(t, ctx, srv.URL()), "show timezone"); got != "Pacific/Chatham" {
		t.Errorf("timezone = %q: initdb did not see TZ", got)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	pidFile, err := os.ReadFile(srv.DataDir() + "/postmaster.pid")
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(pidFile), "\n")
	environ, err := os.ReadFile("/proc/" + strings.TrimSpace(first) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(environ, []byte("\x00GDTEST_MARK=kept\x00")) && !bytes.HasPrefix(environ, []byte("GDTEST_MARK=kept\x00")) {
		t.Errorf("the restarted postmaster's environment lacks GDTEST_MARK=kept")
	}
}
