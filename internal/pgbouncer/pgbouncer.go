//go:build linux

// Package pgbouncer starts a throwaway PgBouncer in front of a PostgreSQL
// server, for tests: [Start] writes a configuration and a user list into a
// temporary directory (the test's own, t.TempDir, unless running as root),
// runs the locally installed pgbouncer binary
// (Debian package pgbouncer) as a child process on a free 127.0.0.1 port and
// stops it when the test ends.
//
// The pooler runs in transaction pooling mode with a small server pool by
// default, so client connections are really multiplexed over few server
// sessions and any session state a client leaves behind (a session advisory
// lock, a SET, a named prepared statement) shows up as a failure. Server
// connections are not reset between clients (PgBouncer runs
// server_reset_query only in session mode).
//
// Typical use in a test:
//
//	url := pgbouncer.Start(t, dbtest.URL())
//	cfg, _ := pgxpool.ParseConfig(url)
//	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
//
// # Running as root
//
// PgBouncer refuses to run as root. When the calling process has effective
// uid 0, pgbouncer runs as an unprivileged user instead ([Options.OSUser];
// by default "nobody", else "postgres"), with its files in a directory of
// its own that that user can reach (made with os.MkdirTemp, in /tmp if
// os.TempDir is not reachable; removed when the test ends), as
// internal/pgtemp does. pgbouncer's own -u switch is not used: it changes
// the user after the start, which clears the parent-death signal, so a
// killed test binary would leave the pooler running.
//
// # Leftovers
//
// pgbouncer is started with a parent-death signal (SIGKILL), so a test
// binary that is killed (or panics on -timeout, skipping cleanups) does not
// leave it running; its directory (pgbouncer-* in os.TempDir, when root)
// does stay behind.
//
// # Missing binary
//
// Without a pgbouncer binary the test is skipped, except when CI=true: then
// it fails (CI installs the package, see .ci/run).
//
// The package is Linux-only (it relies on Linux process attributes).
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/childproc"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// BinEnv, when set, is the path of the pgbouncer binary to run.
	BinEnv = "PGBOUNCER_BIN"

	// DefaultPoolSize is the server connections per database and user
	// pair when Options.PoolSize is zero: small, so that transaction
	// pooling multiplexes.
	DefaultPoolSize = 4

	host                = "127.0.0.1"
	defaultStartTimeout = 30 * time.Second
	stopTimeout         = 10 * time.Second
	pollPeriod          = 25 * time.Millisecond
	tailLines           = 40
	bindAttempts        = 5
)

// Options tune [StartWith]. The zero value is what [Start] uses.
type Options struct {
	// PoolMode is pgbouncer's pool_mode. Default "transaction".
	PoolMode string
	// PoolSize is default_pool_size: server connections per database and
	// user pair. Default DefaultPoolSize.
	PoolSize int
	// MaxClientConn is max_client_conn. Default 500.
	MaxClientConn int
	// Settings are extra or overriding lines of the [pgbouncer] section,
	// e.g. {"query_wait_timeout": "5"}. listen_addr, listen_port,
	// unix_socket_dir, auth_file and auth_type are reserved.
	Settings map[string]string
	// OSUser is the user pgbouncer runs as when the test runs as root.
	// Default "nobody", else "postgres".
	OSUser string
	// StartTimeout bounds the wait for a first query through the pooler to
	// succeed. Default 30s.
	StartTimeout time.Duration
}

// reserved are the settings Start controls.
var reserved = []string{"listen_addr", "listen_port", "unix_socket_dir", "auth_file", "auth_type"}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	// URL connects to the upstream database through the pooler (same user,
	// password and database as the upstream URL; sslmode=disable).
	URL string
	// Port is the pooler's TCP port on 127.0.0.1.
	Port int

	p *childproc.Process
}

// Output is the tail of pgbouncer's log (its stderr).
func (b *Bouncer) Output() string { return b.p.Out.String() }

// Start starts a PgBouncer in transaction pooling mode in front of
// upstreamURL and returns the URL to connect through it. It is stopped
// when t ends.
func Start(t testing.TB, upstreamURL string) string {
	t.Helper()
	return StartWith(t, upstreamURL, Options{}).URL
}

// StartWith is [Start] with options.
func StartWith(t testing.TB, upstreamURL string, opts Options) *Bouncer {
	t.Helper()
	bin, err := FindBinary()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: install Debian's pgbouncer package, as .ci/run does)", err)
		}
		t.Skipf("%v: skipping the test", err)
	}
	b, err := launch(t, bin, upstreamURL, opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// launch starts pgbouncer for t, in a directory of its own, and stops it
// when t ends.
func launch(t testing.TB, bin, upstreamURL string, opts Options) (*Bouncer, error) {
	var cred *syscall.Credential
	var dir string
	if os.Geteuid() == 0 {
		var err error
		if cred, err = childproc.UnprivilegedCredential(opts.OSUser, "nobody", "postgres"); err != nil {
			return nil, fmt.Errorf("pgbouncer: running as root, and no unprivileged user to run pgbouncer as (set Options.OSUser): %w", err)
		}
		if dir, err = childproc.MakeDir("pgbouncer-", cred); err != nil {
			return nil, fmt.Errorf("pgbouncer: %w", err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) }) // after the stop below
	} else {
		dir = t.TempDir()
	}
	b, err := start(dir, bin, upstreamURL, cred, opts)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Errorf("%v", err)
		}
		if t.Failed() {
			t.Logf("pgbouncer on port %d%s", b.Port, b.p.Out.Quote("pgbouncer", tailLines))
		}
	})
	return b, nil
}

// FindBinary locates the pgbouncer binary: $PGBOUNCER_BIN, then
// /usr/sbin/pgbouncer (Debian), then $PATH.
func FindBinary() (string, error) {
	if p := os.Getenv(BinEnv); p != "" {
		if err := executable(p); err != nil {
			return "", fmt.Errorf("pgbouncer: $%s: %w", BinEnv, err)
		}
		return p, nil
	}
	if executable("/usr/sbin/pgbouncer") == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	return "", errors.New("pgbouncer: binary not found (looked in /usr/sbin and $PATH; apt-get install pgbouncer, or set $" + BinEnv + ")")
}

func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

// upstream is what the configuration needs to know of the server.
type upstream struct {
	host, user, password string
	port                 uint16
}

func parseUpstream(raw string) (*upstream, error) {
	cfg, err := pgconn.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: upstream URL: %w", err)
	}
	return &upstream{host: cfg.Host, port: cfg.Port, user: cfg.User, password: cfg.Password}, nil
}

// clientURL is upstreamURL pointed at the pooler.
func clientURL(upstreamURL string, up *upstream, port int) (string, error) {
	hostPort := net.JoinHostPort(host, strconv.Itoa(port))
	if strings.HasPrefix(upstreamURL, "postgres://") || strings.HasPrefix(upstreamURL, "postgresql://") {
		u, err := url.Parse(upstreamURL)
		if err != nil {
			return "", fmt.Errorf("pgbouncer: upstream URL: %w", err)
		}
		u.Host = hostPort
		q := u.Query()
		for _, k := range []string{"host", "hostaddr", "port", "sslmode", "sslcert", "sslkey", "sslrootcert", "target_session_attrs"} {
			q.Del(k)
		}
		q.Set("sslmode", "disable")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	// A keyword/value connection string: the database name is its dbname.
	cfg, err := pgconn.ParseConfig(upstreamURL)
	if err != nil {
		return "", fmt.Errorf("pgbouncer: upstream URL: %w", err)
	}
	u := &url.URL{Scheme: "postgres", Host: hostPort, Path: "/" + cfg.Database, RawQuery: "sslmode=disable"}
	if up.password != "" {
		u.User = url.UserPassword(up.user, up.password)
	} else {
		u.User = url.User(up.user)
	}
	return u.String(), nil
}

// render writes pgbouncer.ini and userlist.txt into dir and returns the
// path of the former.
func render(dir string, up *upstream, port int, cred *syscall.Credential, opts Options) (string, error) {
	quoteVal := func(v string) string { return "'" + strings.ReplaceAll(v, "'", "''") + "'" }
	settings := map[string]string{
		"pool_mode":          "transaction",
		"default_pool_size":  strconv.Itoa(DefaultPoolSize),
		"max_client_conn":    "500",
		"log_connections":    "0",
		"log_disconnections": "0",
		// The admin console (database "pgbouncer"), for tests that look at
		// SHOW POOLS / SHOW SERVERS.
		"admin_users": up.user,
		"stats_users": up.user,
		// pgx sends none, other clients (JDBC) do; harmless to drop.
		"ignore_startup_parameters": "extra_float_digits",
	}
	if opts.PoolMode != "" {
		settings["pool_mode"] = opts.PoolMode
	}
	if opts.PoolSize > 0 {
		settings["default_pool_size"] = strconv.Itoa(opts.PoolSize)
	}
	if opts.MaxClientConn > 0 {
		settings["max_client_conn"] = strconv.Itoa(opts.MaxClientConn)
	}
	for k, v := range opts.Settings {
		k = strings.ToLower(k)
		if slices.Contains(reserved, k) {
			return "", fmt.Errorf("pgbouncer: setting %q is controlled by the helper", k)
		}
		if k == "" || strings.ContainsAny(k, " =\n\r[]") || strings.ContainsAny(v, "\n\r\x00") {
			return "", fmt.Errorf("pgbouncer: invalid setting %q = %q", k, v)
		}
		settings[k] = v
	}
	authFile := filepath.Join(dir, "userlist.txt")
	var b strings.Builder
	b.WriteString("; written by github.com/gendurable/gendurable/internal/pgbouncer\n[databases]\n")
	fmt.Fprintf(&b, "* = host=%s port=%d\n\n[pgbouncer]\n", quoteVal(up.host), up.port)
	fmt.Fprintf(&b, "listen_addr = %s\nlisten_port = %d\nunix_socket_dir =\n", host, port)
	fmt.Fprintf(&b, "auth_type = trust\nauth_file = %s\n", authFile)
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, settings[k])
	}
	// auth_type trust checks no password, but the user must be listed; the
	// password is what pgbouncer logs in to the server with, if it asks.
	quoteUser := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	users := quoteUser(up.user) + " " + quoteUser(up.password) + "\n"
	ini := filepath.Join(dir, "pgbouncer.ini")
	for path, content := range map[string]string{authFile: users, ini: b.String()} {
		if err := writeFile(path, content, cred); err != nil {
			return "", err
		}
	}
	return ini, nil
}

// writeFile writes a file only its owner may read: cred's user if not nil.
func writeFile(path, content string, cred *syscall.Credential) error {
	err := os.WriteFile(path, []byte(content), 0o600)
	if err == nil && cred != nil {
		err = os.Chown(path, int(cred.Uid), int(cred.Gid))
	}
	if err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	return nil
}

// errBind: pgbouncer could not listen on the port (someone took it between
// our probe and its bind).
var errBind = errors.New("pgbouncer: port taken")

func start(dir, bin, upstreamURL string, cred *syscall.Credential, opts Options) (*Bouncer, error) {
	up, err := parseUpstream(upstreamURL)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		b, err := startOn(dir, bin, upstreamURL, up, port, cred, opts)
		if errors.Is(err, errBind) && attempt < bindAttempts {
			continue
		}
		return b, err
	}
}

func startOn(dir, bin, upstreamURL string, up *upstream, port int, cred *syscall.Credential, opts Options) (*Bouncer, error) {
	ini, err := render(dir, up, port, cred, opts)
	if err != nil {
		return nil, err
	}
	connURL, err := clientURL(upstreamURL, up, port)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, ini)
	cmd.Dir = dir
	cmd.Env = childproc.Env()
	out := &childproc.Tail{}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.WaitDelay = 3 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    true,            // terminal ^C does not reach it
		Pdeathsig:  syscall.SIGKILL, // does not outlive a killed test binary
		Credential: cred,            // nil: run as ourselves
	}
	p, err := childproc.Start(cmd, out)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: starting %s: %w", bin, err)
	}
	b := &Bouncer{URL: connURL, Port: port, p: p}
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = defaultStartTimeout
	}
	if err := b.waitReady(timeout); err != nil {
		_ = b.stop()
		return nil, err
	}
	return b, nil
}

// waitReady polls until a connection through the pooler reaches the
// server and runs a query.
func (b *Bouncer) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var lastErr error
	for {
		actx, acancel := context.WithTimeout(ctx, 3*time.Second)
		conn, err := pgconn.Connect(actx, b.URL)
		if err == nil {
			_, err = conn.Exec(actx, "SELECT 1").ReadAll()
			_ = conn.Close(actx)
		}
		acancel()
		if err == nil {
			return nil
		}
		lastErr = err
		t := time.NewTimer(pollPeriod)
		select {
		case <-b.p.Done():
			t.Stop()
			err := fmt.Errorf("pgbouncer: exited during startup (%v)%s", b.p.Err(), b.p.Out.Quote("pgbouncer", tailLines))
			if o := b.p.Out.String(); strings.Contains(o, "Address already in use") {
				err = fmt.Errorf("%w %d: %w", errBind, b.Port, err)
			}
			return err
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgbouncer: no working connection through port %d within %s (last error: %v)%s",
				b.Port, timeout, lastErr, b.p.Out.Quote("pgbouncer", tailLines))
		case <-t.C:
		}
	}
}

// stop shuts pgbouncer down at once (SIGTERM: client connections are
// closed) and kills it if it lingers.
func (b *Bouncer) stop() error {
	p := b.p
	select {
	case <-p.Done():
		return nil
	default:
	}
	pid := p.Cmd.Process.Pid
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-p.Done():
		return nil
	case <-t.C:
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-p.Done()
	return fmt.Errorf("pgbouncer (pid %d) did not exit within %s of SIGTERM; killed it%s", pid, stopTimeout, p.Out.Quote("pgbouncer", tailLines))
}

// freePort asks the kernel for a currently unused loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("pgbouncer: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
