package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"unicode"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/gendurable/gendurable/internal/smallfile"
)

// Environment variables the ui command reads its credentials from, so they
// need not appear on the command line (where ps shows them).
const (
	envUIToken     = "GENDURABLE_UI_TOKEN"
	envUIBasicAuth = "GENDURABLE_UI_BASIC_AUTH"
)

// minRemoteToken is the shortest bearer token, and basic-auth password,
// accepted beyond loopback.
const minRemoteToken = 16

// credentialFlags says how to give ui credentials: the ways that keep them
// out of ps first (--token and --basic-auth work too, with a warning).
const credentialFlags = "--token-file F, --basic-auth-file F, or " + envUIToken + " / " + envUIBasicAuth + " in the environment"

// maxUIConns bounds --max-conns: a file descriptor each.
const maxUIConns = 65536

// uiCmd serves the dashboard until interrupted. It binds to loopback unless
// told otherwise; a non-loopback address needs --token (of 16 bytes or
// more) or --basic-auth.
func uiCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("ui")
	var c common
	c.register(fs)
	addr := fs.String("addr", dashboard.DefaultAddr, "listen address")
	readOnly := fs.Bool("read-only", false, "hide and refuse every action")
	// Given empty (--token "$UNSET"), a credential is a usage error, not
	// no authentication: a hostile-operator probe's dashboard served every
	// request with none.
	token, tokenFile, basic, basicFile := new(string), new(string), new(string), new(string)
	fs.Var(credentialFlag{token}, "token", "require this bearer `token` (visible in ps: prefer --token-file or "+envUIToken+")")
	fs.Var(credentialFlag{tokenFile}, "token-file", "require the bearer token in this `file`")
	fs.Var(credentialFlag{basic}, "basic-auth", "require HTTP basic auth, as `user:password` (visible in ps: prefer --basic-auth-file or "+envUIBasicAuth+")")
	fs.Var(credentialFlag{basicFile}, "basic-auth-file", "require HTTP basic auth, user:password read from this `file`")
	var allowed []string
	fs.Func("allowed-host", "serve this Host name too, besides the listen address and loopback names (repeatable; * for any)", func(v string) error {
		allowed = append(allowed, v)
		return nil
	})
	var trusted []string
	fs.Func("trusted-origin", "accept actions from this origin (scheme://host[:port]), for a proxy that rewrites the Host header (repeatable)", func(v string) error {
		trusted = append(trusted, v)
		return nil
	})
	maxConns := fs.Int("max-conns", dashboard.DefaultMaxConns, "connections served at once; more wait")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	tok, err := secret("token", *token, *tokenFile, envUIToken, stderr)
	if err != nil {
		return err
	}
	basicAuth, err := secret("basic-auth", *basic, *basicFile, envUIBasicAuth, stderr)
	if err != nil {
		return err
	}
	var lh slog.Handler = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	if c.json { // JSON lines on stderr, as every --json command's log and audit lines
		lh = slog.NewJSONHandler(inertWriter{stderr}, &slog.HandlerOptions{Level: slog.LevelWarn})
	}
	logger := slog.New(lh)
	opts := dashboard.Options{ReadOnly: *readOnly, BearerToken: strings.TrimSpace(tok), AllowedHosts: allowed, TrustedOrigins: trusted,
		Logger: logger, AuditLogger: logger} // the audit trail is at dashboard.LevelAudit (Warn): always on
	if basicAuth != "" {
		user, pass, ok := strings.Cut(basicAuth, ":")
		if !ok || user == "" || pass == "" {
			return usageError{msg: "--basic-auth takes user:password"}
		}
		opts.BasicAuth = &dashboard.BasicAuth{User: user, Password: pass}
	}
	if tok != "" && opts.BearerToken == "" {
		return usageError{msg: "the bearer token is only white space"}
	}
	host, port, err := net.SplitHostPort(*addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port) // a number within 0..65535, or a service name
	}
	if err != nil {
		return usageError{msg: fmt.Sprintf("--addr %q: %v", *addr, err)}
	}
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		switch {
		case opts.BearerToken == "" && opts.BasicAuth == nil:
			return usageError{msg: "serving beyond loopback needs a bearer token or basic auth: " + credentialFlags}
		case opts.BearerToken != "" && len(opts.BearerToken) < minRemoteToken:
			return usageError{msg: fmt.Sprintf("serving beyond loopback needs a token of at least %d bytes", minRemoteToken)}
		case opts.BasicAuth != nil && len(opts.BasicAuth.Password) < minRemoteToken:
			// Either credential lets a client in, and failed logins are
			// only logged, not slowed: a short password is guessed
			// online (thousands of tries a second) whatever the token.
			return usageError{msg: fmt.Sprintf("serving beyond loopback needs a basic-auth password of at least %d bytes", minRemoteToken)}
		}
	}
	if slices.Contains(allowed, "*") && opts.BearerToken == "" && opts.BasicAuth == nil {
		// The Host check is what keeps a page whose DNS name was rebound to
		// this address from reading and driving a dashboard without
		// credentials: its requests are same-origin to the browser.
		return usageError{msg: "--allowed-host '*' needs a bearer token or basic auth (" + credentialFlags + "): without them, the Host check is what keeps " +
			"any web page (through a DNS name rebound to this address) from using the dashboard"}
	}
	if *maxConns <= 0 || *maxConns > maxUIConns {
		return usageError{msg: fmt.Sprintf("--max-conns must be 1 to %d (each connection takes a file descriptor)", maxUIConns)}
	}
	c.ui = true
	eng, pool, err := c.uncheckedEngine(ctx, stderr)
	if err != nil {
		return err
	}
	defer closePool(pool)
	h, err := dashboard.New(eng, opts)
	if err != nil {
		return usageError{msg: err.Error()}
	}
	if err := checkConnection(ctx, pool); err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	v, err := sameVersion(ctx, pool, c.schema)
	if err != nil {
		return err
	}
	// A schema never migrated (or misspelt): every page would fail with
	// 503 while the server ran on; say so and exit, as for another version.
	if v == 0 {
		// The advice to check --schema is reportError's, as for every
		// command (it read "(or check --schema) (the database is …)"
		// here, the other way round elsewhere: a newcomer's probe).
		return fmt.Errorf("%w: schema %q has no gendurable tables; run `gendurable migrate up --schema %s` first",
			gendurable.ErrNotMigrated, c.schema, c.schema)
	}
	srv := dashboard.NewServer(h, dashboard.ServerOptions{MaxConns: *maxConns})
	if c.json { // net/http's own messages (accept errors, a recovered panic) as JSON lines too
		srv.ErrorLog = slog.NewLogLogger(lh, slog.LevelWarn)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		// Code error (sqlq.ConnectionFailure leaves a listen out), naming
		// the flag.
		return fmt.Errorf("--addr: %w (choose another address or port)", err)
	}
	url := fmt.Sprintf("http://%s/", ln.Addr())
	if a, ok := ln.Addr().(*net.TCPAddr); ok && a.IP.IsUnspecified() {
		// Every interface (0.0.0.0, [::], or no host): printed as Go names
		// it, "http://[::]:8080/", it read as another address than the one
		// asked for (a newcomer's probe); this machine reaches it as
		// localhost.
		url = fmt.Sprintf("http://localhost:%d/", a.Port)
	}
	note := func(msg string) { fmt.Fprintf(stderr, "gendurable: ui: %s\n", msg) }
	if c.json {
		if err := printJSON(stdout, map[string]string{"dashboard": url}); err != nil {
			return err
		}
		note = func(msg string) { // one line, as the log's
			b, _ := json.Marshal(map[string]string{"msg": "gendurable: ui: " + msg})
			_, _ = inertWriter{stderr}.Write(append(b, '\n'))
		}
	} else {
		where := ""
		if a, ok := ln.Addr().(*net.TCPAddr); ok && a.IP.IsUnspecified() {
			where = ", listening on every interface"
		}
		fmt.Fprintf(stdout, "dashboard on %s (Ctrl-C to stop%s)\n", url, where)
	}
	return serveUntil(ctx, srv, dashboard.LimitListener(ln, *maxConns), note)
}

// uiShutdownTimeout bounds how long an interrupted `gendurable ui` waits
// for the requests under way: the dashboard bounds each by its
// RequestTimeout, and a bulk statement under way then by
// gendurable.BulkStatementGrace more, so they end within the write timeout.
const uiShutdownTimeout = dashboard.DefaultWriteTimeout

// serveUntil serves ln until ctx ends, then stops taking connections and
// returns once the requests under way have been answered (at most
// uiShutdownTimeout; those still running then are cut off, and it says
// so). http.Server.Serve returns as soon as Shutdown begins: returning
// then let the process exit under a request still running — a retry or
// cancel by filter stopped between its batches, its answer and its audit
// line lost.
func serveUntil(ctx context.Context, srv *http.Server, ln net.Listener, note func(msg string)) error {
	stopped := make(chan struct{}) // Serve returned on its own
	drained := make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
		case <-stopped:
			drained <- nil
			return
		}
		note(fmt.Sprintf("stopping; answering the requests under way first (at most %s)", uiShutdownTimeout))
		shutdown, cancel := context.WithTimeout(context.Background(), uiShutdownTimeout)
		defer cancel()
		err := srv.Shutdown(shutdown)
		if err != nil {
			_ = srv.Close()
			err = fmt.Errorf("ui: requests still under way %s after the interrupt were cut off: %w", uiShutdownTimeout, err)
		}
		drained <- err
	}()
	err := srv.Serve(ln)
	close(stopped)
	if !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return <-drained
}

// secret is a credential from its flag, its file, or its environment
// variable; giving both the flag and the file is a usage error. A file's
// trailing line break ("\n" or "\r\n", one) is not part of the secret.
func secret(name, value, file, env string, stderr io.Writer) (string, error) {
	switch {
	case value != "" && file != "":
		return "", usageError{msg: fmt.Sprintf("give --%s or --%s-file, not both", name, name)}
	case value != "":
		fmt.Fprintf(stderr, "gendurable: warning: --%s is visible to every user of this machine (ps); prefer --%s-file or %s\n", name, name, env)
		return value, nil
	case file != "":
		b, err := readSecretFile(file)
		if err != nil {
			return "", usageError{msg: fmt.Sprintf("--%s-file: %v", name, err)}
		}
		// One line break, as an editor or echo leaves it; a second (a
		// blank line after) is a control character the dashboard refuses.
		s, ok := strings.CutSuffix(string(b), "\n")
		if ok {
			s = strings.TrimSuffix(s, "\r")
		}
		if s == "" {
			return "", usageError{msg: fmt.Sprintf("--%s-file %s is empty", name, file)}
		}
		// Refused here, not left to the dashboard, which trims white space
		// first: "tok\n\n" passed as "tok" (a probe).
		if strings.ContainsFunc(s, unicode.IsControl) { // the dashboard's own test (hasControl)
			return "", usageError{msg: fmt.Sprintf("--%s-file %s holds a control character (a second line, or a blank one after the credential?): a credential is one line", name, file)}
		}
		return s, nil
	}
	if v, set := os.LookupEnv(env); set && strings.TrimSpace(v) == "" {
		return "", usageError{msg: fmt.Sprintf("%s is set but empty: give it the credential, or unset it (given empty, as an unset shell variable gives it, it would be read as none)", env)}
	}
	return os.Getenv(env), nil
}

// errEmptyCredential: --token, --basic-auth or their -file was given empty.
var errEmptyCredential = errors.New("empty: give the credential (given empty, as an unset shell variable gives it, authentication would be off)")

// credentialFlag is a credential flag that refuses an empty value (one of
// white space only is refused later, in its own words).
type credentialFlag struct{ s *string }

func (f credentialFlag) String() string {
	if f.s == nil {
		return ""
	}
	return *f.s
}

func (f credentialFlag) Set(v string) error {
	if v == "" {
		return errEmptyCredential
	}
	*f.s = v
	return nil
}

// maxSecretFile bounds what --token-file and --basic-auth-file read: a
// credential is a line, and a file past this is not one (a log, a key
// store, /dev/zero — which would otherwise be read until memory ran out).
const maxSecretFile = 4 << 10

// errSecretTooLarge: a secret file is over maxSecretFile.
var errSecretTooLarge = fmt.Errorf("longer than %d bytes: not a file holding one credential", maxSecretFile)

// readSecretFile reads a credential file of at most maxSecretFile bytes,
// only a regular one (smallfile.Read: a hostile probe's --token-file FIFO
// held the command in open, deaf to Ctrl-C and SIGTERM, until kill -9).
func readSecretFile(name string) ([]byte, error) {
	b, err := smallfile.Read(name, maxSecretFile)
	if errors.Is(err, smallfile.ErrTooLarge) {
		return nil, fmt.Errorf("%s: %w", name, errSecretTooLarge)
	}
	return b, err
}
