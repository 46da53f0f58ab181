//go:build linux

package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gendurable/gendurable/internal/childproc"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// DefaultStartTimeout bounds initdb plus server startup when
	// Options.StartTimeout is zero (the caller's context may be shorter).
	DefaultStartTimeout = 60 * time.Second
	// DefaultStopTimeout is how long Stop and Restart wait for the postmaster
	// to exit before killing it, when Options.StopTimeout is zero.
	DefaultStopTimeout = 15 * time.Second

	// BinDirEnv, when set, names the directory holding initdb and postgres
	// and takes precedence over discovery (but not over Options.BinDir).
	BinDirEnv = "PGTEMP_BINDIR"

	host       = "127.0.0.1"
	superuser  = "postgres"
	tailLines  = 30 // lines of a child's output quoted in errors
	waitDelay  = 3 * time.Second
	pollPeriod = 25 * time.Millisecond
)

// ErrStopped is returned by Restart after Stop.
var ErrStopped = errors.New("pgtemp: server is stopped")

// defaultSettings are written to postgresql.conf; Options.Settings override
// them. They trade durability for speed: data survives a clean shutdown or a
// crash of the postgres processes, but commits acknowledged just before such
// a crash can be lost (synchronous_commit=off), and nothing survives an OS
// crash (fsync=off).
var defaultSettings = map[string]string{
	"fsync":              "off",
	"synchronous_commit": "off",
	"full_page_writes":   "off",
	"logging_collector":  "off", // the log goes to stderr, which we capture
	"log_destination":    "stderr",
}

// reservedSettings are controlled by pgtemp (passed on the postgres command
// line) and may not be set through Options.Settings.
var reservedSettings = []string{"listen_addresses", "port", "unix_socket_directories"}

// Options configures Start. The zero value is ready to use.
type Options struct {
	// BinDir is the directory containing the initdb and postgres binaries.
	// Default: $PGTEMP_BINDIR if set, else discovered by FindBinDir.
	BinDir string

	// Port is the TCP port to listen on (127.0.0.1 only).
	// Default 0: pick a free port.
	Port int

	// Log, if non-nil, receives the output of initdb and postgres (the
	// server log). Write errors are ignored. pgtemp keeps the tail of the
	// output regardless, to quote it in errors.
	Log io.Writer

	// Settings are extra postgresql.conf settings, e.g.
	// {"max_connections": "200", "log_statement": "all"}. They override the
	// defaults (fsync, synchronous_commit and full_page_writes off).
	// listen_addresses, port and unix_socket_directories are reserved.
	Settings map[string]string

	// OSUser is the operating-system user that runs initdb and postgres
	// when the calling process is root. Default: "postgres" if that user
	// exists, else "nobody". Ignored when not running as root.
	OSUser string

	// StartTimeout bounds initdb plus startup in Start, and the startup in
	// Restart, on top of the context. Default DefaultStartTimeout.
	StartTimeout time.Duration

	// StopTimeout is how long to wait for the postmaster to exit after
	// asking it to shut down, before killing it. Default DefaultStopTimeout.
	StopTimeout time.Duration

	// Env holds extra KEY=VALUE environment variables for initdb and every
	// start of postgres (restarts included), e.g. an LD_PRELOAD. The
	// calling process's environment is passed on too, minus PG* variables.
	Env []string
}

// Server is a running throwaway PostgreSQL cluster. Its methods are safe for
// concurrent use.
type Server struct {
	binDir  string
	baseDir string // temp dir: socket dir, parent of dataDir; removed on Stop
	dataDir string
	port    int
	cred    *syscall.Credential // nil: run as ourselves
	log     io.Writer           // never fails; may be io.Discard
	startTO time.Duration
	stopTO  time.Duration
	env     []string
	mu      sync.Mutex
	pm      *childproc.Process // the running postmaster, nil while down
	stopped bool
	stopErr error
}

// Start creates a fresh cluster in a new temporary directory, starts it and
// waits until it accepts connections. On error nothing is left behind.
func Start(ctx context.Context, opts Options) (srv *Server, err error) {
	if opts.Port < 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("pgtemp: invalid port %d", opts.Port)
	}
	conf, err := renderSettings(opts.Settings)
	if err != nil {
		return nil, err
	}
	s := &Server{
		port:    opts.Port,
		log:     io.Discard,
		startTO: orDefault(opts.StartTimeout, DefaultStartTimeout),
		stopTO:  orDefault(opts.StopTimeout, DefaultStopTimeout),
		env:     append(childproc.Env(), opts.Env...),
	}
	if opts.Log != nil {
		s.log = &safeWriter{w: opts.Log}
	}
	ctx, cancel := context.WithTimeout(ctx, s.startTO)
	defer cancel()

	s.binDir = opts.BinDir
	if s.binDir == "" {
		if s.binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if err := checkBinDir(s.binDir); err != nil {
		return nil, fmt.Errorf("pgtemp: Options.BinDir: %w", err)
	}

	if os.Geteuid() == 0 {
		if s.cred, err = childproc.UnprivilegedCredential(opts.OSUser, "postgres", "nobody"); err != nil {
			return nil, fmt.Errorf("pgtemp: running as root, and no unprivileged user to run postgres as (set Options.OSUser): %w", err)
		}
	}

	if s.baseDir, err = makeBaseDir(s.cred); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = s.Stop()
			srv = nil
		}
	}()
	s.dataDir = filepath.Join(s.baseDir, "data")

	if err := s.initdb(ctx); err != nil {
		return nil, err
	}
	if err := s.appendConf(conf); err != nil {
		return nil, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if opts.Port != 0 {
		return s, s.startLocked(ctx)
	}
	// Pick a free port. Another process may grab it between our probe and
	// the postmaster's bind, so retry a few times on bind failures.
	for attempt := 1; ; attempt++ {
		if s.port, err = freePort(); err != nil {
			return nil, err
		}
		err = s.startLocked(ctx)
		if err == nil || attempt == 5 || !errors.Is(err, errBind) || ctx.Err() != nil {
			return s, err
		}
	}
}

// URL returns the connection URL of the "postgres" database, e.g.
// postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable.
func (s *Server) URL() string { return s.DatabaseURL("postgres") }

// DatabaseURL is like URL but for the named database (which must exist).
func (s *Server) DatabaseURL(name string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", superuser,
		net.JoinHostPort(host, strconv.Itoa(s.port)), url.PathEscape(name))
}

// Host returns the address the server listens on: always "127.0.0.1".
func (s *Server) Host() string { return host }

// Port returns the TCP port the server listens on.
func (s *Server) Port() int { return s.port }

// DataDir returns the cluster's data directory (PGDATA).
func (s *Server) DataDir() string { return s.dataDir }

// SocketDir returns the directory holding the server's Unix socket.
func (s *Server) SocketDir() string { return s.baseDir }

// BinDir returns the directory of the PostgreSQL binaries in use.
func (s *Server) BinDir() string { return s.binDir }

// Stop shuts the server down (fast shutdown: open sessions are terminated),
// kills it if it has not exited within the stop timeout, and removes the
// temporary directory. It is safe to call more than once; later calls return
// the first call's result.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return s.stopErr
	}
	s.stopped = true
	var errs []error
	if err := s.shutdownLocked(syscall.SIGINT); err != nil {
		errs = append(errs, err)
	}
	if s.baseDir != "" {
		if err := os.RemoveAll(s.baseDir); err != nil {
			errs = append(errs, fmt.Errorf("pgtemp: removing %s: %w", s.baseDir, err))
		}
	}
	s.stopErr = errors.Join(errs...)
	return s.stopErr
}

// Restart shuts the server down cleanly (fast shutdown, so open sessions are
// terminated) and starts it again on the same data directory and port,
// waiting until it accepts connections. If the postmaster had already died,
// Restart just starts it.
func (s *Server) Restart(ctx context.Context) error {
	return s.restart(ctx, syscall.SIGINT)
}

// CrashRestart simulates a database crash: it stops the server with an
// immediate shutdown (SIGQUIT: all server processes quit without a
// checkpoint, as after a crash), then starts it again, which makes
// PostgreSQL run crash recovery from the WAL.
//
// Note that with the default synchronous_commit=off, transactions committed
// shortly before the crash may be lost; set Options.Settings
// {"synchronous_commit": "on"} when a test needs every acknowledged commit
// to survive.
func (s *Server) CrashRestart(ctx context.Context) error {
	return s.restart(ctx, syscall.SIGQUIT)
}

func (s *Server) restart(ctx context.Context, sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return ErrStopped
	}
	if err := s.shutdownLocked(sig); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.startTO)
	defer cancel()
	return s.startLocked(ctx)
}

// errBind marks a startup failure caused by the port being taken.
var errBind = errors.New("pgtemp: could not bind port")

// initdb creates the cluster in s.dataDir.
func (s *Server) initdb(ctx context.Context) error {
	out := &childproc.Tail{}
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, "initdb"),
		"-D", s.dataDir,
		"-U", superuser,
		"--auth=trust",
		"-E", "UTF8",
		"--locale=C",
		"--no-sync",
	)
	s.prepare(cmd, out)
	cmd.Cancel = func() error { // on ctx expiry, kill initdb and its helpers
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	p, err := childproc.Start(cmd, out)
	if err != nil {
		return fmt.Errorf("pgtemp: starting initdb: %w", err)
	}
	<-p.Done()
	if p.Err() != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("pgtemp: initdb: %w (%v)%s", context.Cause(ctx), p.Err(), out.Quote("initdb", tailLines))
		}
		return fmt.Errorf("pgtemp: initdb failed: %w%s", p.Err(), out.Quote("initdb", tailLines))
	}
	return nil
}

// appendConf appends the settings to postgresql.conf (appending keeps the
// file's owner, which matters when running as root).
func (s *Server) appendConf(conf string) error {
	f, err := os.OpenFile(filepath.Join(s.dataDir, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtemp: writing postgresql.conf: %w", err)
	}
	return nil
}

// startLocked starts the postmaster and waits until it accepts connections.
func (s *Server) startLocked(ctx context.Context) error {
	out := &childproc.Tail{}
	cmd := exec.Command(filepath.Join(s.binDir, "postgres"),
		"-D", s.dataDir,
		"-p", strconv.Itoa(s.port),
		"-c", "listen_addresses="+host,
		"-c", "unix_socket_directories="+s.baseDir,
	)
	s.prepare(cmd, out)
	p, err := childproc.Start(cmd, out)
	if err != nil {
		return fmt.Errorf("pgtemp: starting postgres: %w", err)
	}
	s.pm = p
	if err := s.waitReady(ctx, p); err != nil {
		// Do not leave a half-started postmaster behind.
		_ = s.shutdownLocked(syscall.SIGQUIT)
		return err
	}
	return nil
}

// waitReady polls until a real connection to the server succeeds.
func (s *Server) waitReady(ctx context.Context, p *childproc.Process) error {
	connURL := s.URL()
	var lastErr error
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgconn.Connect(attemptCtx, connURL)
		cancel()
		if err == nil {
			return conn.Close(ctx)
		}
		lastErr = err
		t := time.NewTimer(pollPeriod)
		select {
		case <-p.Done():
			t.Stop()
			output := p.Out.String()
			err := fmt.Errorf("pgtemp: postgres exited during startup (%v)%s", p.Err(), p.Out.Quote("postgres", tailLines))
			if strings.Contains(output, "could not bind") || strings.Contains(output, "could not create any TCP/IP sockets") {
				err = fmt.Errorf("%w %d: %w", errBind, s.port, err)
			}
			return err
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgtemp: postgres did not accept connections on port %d: %w (last error: %v)%s",
				s.port, context.Cause(ctx), lastErr, p.Out.Quote("postgres", tailLines))
		case <-t.C:
		}
	}
}

// shutdownLocked asks the postmaster to stop with sig (SIGTERM smart,
// SIGINT fast, SIGQUIT immediate), waits up to the stop timeout and then
// kills it. It is a no-op when the postmaster is not running.
func (s *Server) shutdownLocked(sig syscall.Signal) error {
	p := s.pm
	if p == nil {
		return nil
	}
	s.pm = nil
	select {
	case <-p.Done():
		return nil // already exited
	default:
	}
	pid := p.Cmd.Process.Pid
	if err := p.Cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgtemp: signalling postgres (pid %d): %w", pid, err)
	}
	t := time.NewTimer(s.stopTO)
	defer t.Stop()
	select {
	case <-p.Done():
		return nil
	case <-t.C:
	}
	// Kill the postmaster (and anything left in its process group; server
	// children detect the postmaster's death and exit on their own).
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = p.Cmd.Process.Kill()
	<-p.Done()
	return fmt.Errorf("pgtemp: postgres (pid %d) did not exit within %s of %v; killed it%s",
		pid, s.stopTO, sig, p.Out.Quote("postgres", tailLines))
}

// prepare sets up the environment, credentials and output of a child.
func (s *Server) prepare(cmd *exec.Cmd, out *childproc.Tail) {
	cmd.Dir = s.baseDir
	cmd.Env = s.env
	cmd.Stdout = io.MultiWriter(out, s.log) // same writer: one pipe for both
	cmd.Stderr = cmd.Stdout
	cmd.WaitDelay = waitDelay
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    true,            // own process group: terminal ^C does not reach it
		Pdeathsig:  syscall.SIGKILL, // do not outlive a killed test binary
		Credential: s.cred,
	}
}

// makeBaseDir creates the temporary directory, owned by the user that will
// run postgres (see childproc.MakeDir). It is 0755 so that other local users
// may use the Unix socket in it; the data directory inside is 0700 (initdb).
func makeBaseDir(cred *syscall.Credential) (string, error) {
	dir, err := childproc.MakeDir("pgtemp-", cred)
	if err != nil {
		return "", fmt.Errorf("pgtemp: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("pgtemp: preparing %s: %w", dir, err)
	}
	return dir, nil
}

// FindBinDir locates a directory holding the PostgreSQL server binaries
// (initdb and postgres). It tries, in order: $PGTEMP_BINDIR; the output of
// `pg_config --bindir`; the highest version among /usr/lib/postgresql/*/bin
// (Debian, Ubuntu) and /usr/pgsql-*/bin (RHEL); /usr/local/pgsql/bin; and
// finally the directory of initdb found in $PATH.
func FindBinDir() (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		if err := checkBinDir(d); err != nil {
			return "", fmt.Errorf("pgtemp: $%s: %w", BinDirEnv, err)
		}
		return d, nil
	}
	var tried []string
	try := func(d string) bool {
		if d == "" || slices.Contains(tried, d) {
			return false
		}
		tried = append(tried, d)
		return checkBinDir(d) == nil
	}
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		out, err := exec.Command(pgConfig, "--bindir").Output()
		if d := strings.TrimSpace(string(out)); err == nil && try(d) {
			return d, nil
		}
	}
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"} {
		dirs, _ := filepath.Glob(pattern)
		sort.Slice(dirs, func(i, j int) bool { return versionLess(dirs[j], dirs[i]) }) // highest first
		for _, d := range dirs {
			if try(d) {
				return d, nil
			}
		}
	}
	if try("/usr/local/pgsql/bin") {
		return "/usr/local/pgsql/bin", nil
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(initdb); err == nil && try(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if try(filepath.Dir(initdb)) {
			return filepath.Dir(initdb), nil
		}
	}
	return "", fmt.Errorf("pgtemp: PostgreSQL server binaries (initdb, postgres) not found "+
		"(looked in %s; install the server, e.g. apt-get install postgresql, or set $%s)",
		strings.Join(append(tried, "$PATH"), ", "), BinDirEnv)
}

// checkBinDir verifies that dir holds executable initdb and postgres files.
func checkBinDir(dir string) error {
	for _, name := range []string{"initdb", "postgres"} {
		path := filepath.Join(dir, name)
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file", path)
		}
	}
	return nil
}

// versionLess compares paths by the version numbers embedded in them
// (".../9.6/bin" < ".../15/bin"), falling back to string order.
func versionLess(a, b string) bool {
	va, vb := versionOf(a), versionOf(b)
	if c := slices.Compare(va, vb); c != 0 {
		return c < 0
	}
	return a < b
}

func versionOf(path string) []int {
	var v []int
	for _, f := range strings.FieldsFunc(path, func(r rune) bool { return r < '0' || r > '9' }) {
		n, _ := strconv.Atoi(f)
		v = append(v, n)
	}
	return v
}

// renderSettings validates the settings and renders them, on top of the
// defaults, as postgresql.conf lines.
func renderSettings(extra map[string]string) (string, error) {
	all := make(map[string]string, len(defaultSettings)+len(extra))
	for k, v := range defaultSettings {
		all[k] = v
	}
	for k, v := range extra {
		if k == "" || strings.IndexFunc(k, func(r rune) bool {
			return !(r == '_' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
		}) >= 0 {
			return "", fmt.Errorf("pgtemp: invalid setting name %q", k)
		}
		if slices.Contains(reservedSettings, strings.ToLower(k)) {
			return "", fmt.Errorf("pgtemp: setting %q is controlled by pgtemp (use Options.Port for the port)", k)
		}
		if strings.ContainsAny(v, "\n\r\x00") {
			return "", fmt.Errorf("pgtemp: invalid value for setting %s: %q", k, v)
		}
		all[strings.ToLower(k)] = v
	}
	keys := make([]string, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("\n# Added by pgtemp (github.com/gendurable/gendurable/internal/pgtemp).\n")
	for _, k := range keys {
		v := strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(all[k])
		fmt.Fprintf(&b, "%s = '%s'\n", k, v)
	}
	return b.String(), nil
}

// freePort asks the kernel for a currently unused loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("pgtemp: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// safeWriter serialises writes to the user's log writer and swallows its
// errors, so a failing writer never breaks the server's output pipe.
type safeWriter struct {
	mu     sync.Mutex
	w      io.Writer
	failed bool
}

func (s *safeWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.failed {
		if _, err := s.w.Write(p); err != nil {
			s.failed = true
		}
	}
	return len(p), nil
}
