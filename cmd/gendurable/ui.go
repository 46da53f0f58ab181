package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gendurable/gendurable/dashboard"
)

// uiCmd serves the dashboard until interrupted. It binds to loopback unless
// told otherwise; a non-loopback address needs --token or --basic-auth.
func uiCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ui", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	addr := fs.String("addr", dashboard.DefaultAddr, "listen address")
	readOnly := fs.Bool("read-only", false, "hide and refuse every action")
	token := fs.String("token", "", "require this bearer token")
	basic := fs.String("basic-auth", "", "require HTTP basic auth, as user:password")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	opts := dashboard.Options{ReadOnly: *readOnly, BearerToken: *token,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if *basic != "" {
		user, pass, ok := strings.Cut(*basic, ":")
		if !ok || user == "" || pass == "" {
			return usageError{"--basic-auth takes user:password"}
		}
		opts.BasicAuth = &dashboard.BasicAuth{User: user, Password: pass}
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return usageError{fmt.Sprintf("--addr %q: %v", *addr, err)}
	}
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" && opts.BearerToken == "" && opts.BasicAuth == nil {
		return usageError{"serving beyond loopback needs --token or --basic-auth"}
	}
	eng, done, err := c.engine(ctx)
	if err != nil {
		return err
	}
	defer done()
	h, err := dashboard.New(eng, opts)
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "dashboard on http://%s/ (Ctrl-C to stop)\n", ln.Addr())
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
