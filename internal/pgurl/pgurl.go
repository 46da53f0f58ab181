// Package pgurl parses the database URL of gendurable's commands (the CLI,
// its demo, the quickstart example) with one rule for the time a
// connection attempt may take.
package pgurl

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultConnectTimeout bounds each connection attempt of a command whose
// database URL sets no connect_timeout (and PGCONNECT_TIMEOUT is unset).
// pgx's default is none: a server that accepts the connection and never
// answers (a network cut off behind a proxy or a load balancer, a stopped
// process) held the command until Ctrl-C, and one whose packets are
// dropped until the OS gave up (about two minutes on Linux).
const DefaultConnectTimeout = 10 * time.Second

// ParseConfig is pgxpool.ParseConfig, with DefaultConnectTimeout where url
// sets no connect timeout of its own.
//
// A URL whose user or password holds an '@' or a '/' not percent-encoded
// is refused (ErrReservedInURL), before pgx reads it: pgx ended the
// password at one of them and took the rest for the host or the database,
// which its connection errors then printed — "lookup cd-PRIVATE@127.0.0.1:
// no such host" for the password "ab@cd-PRIVATE" (an operator probe).
func ParseConfig(url string) (*pgxpool.Config, error) {
	if err := reservedInURL(url); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, HideConnString(err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 && !strings.Contains(url, "connect_timeout") && os.Getenv("PGCONNECT_TIMEOUT") == "" {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	return cfg, nil
}

// NewPool connects a pool to url, configured by ParseConfig.
func NewPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := ParseConfig(url)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// HideConnString is err with the connection string its message repeats
// left out (errors.As still finds the *pgconn.ParseConfigError, whose
// ConnString holds it): pgx masks the password it recognizes, and missed
// one written "password = secret" (spaces around = are valid there), which
// a CI log then kept (a hostile-operator probe).
func HideConnString(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return err
	}
	hidden := *pe
	hidden.ConnString = "(not shown: it may hold a password)"
	return &hiddenConnString{msg: strings.ReplaceAll(err.Error(), pe.Error(), hidden.Error()), err: err}
}

type hiddenConnString struct {
	msg string
	err error
}

func (h *hiddenConnString) Error() string { return h.msg }
func (h *hiddenConnString) Unwrap() error { return h.err }

// ErrReservedInURL is ParseConfig's error for a URL whose user or password
// holds a character a URL reserves, not percent-encoded. The URL is not
// repeated: it may hold a password.
var ErrReservedInURL = errors.New("the URL's user or password holds an @ or a / that is not percent-encoded " +
	"(write @ as %40, / as %2F, : as %3A; the URL is not shown: it may hold a password)")

// reservedInURL is ErrReservedInURL if url is a postgres:// or
// postgresql:// URL that pgx would read with part of its password as the
// host or the database. pgx ends the user information at the first '@'
// before the first '/' (a '?' or '#' does not end it), and the host at the
// first '/' or '?': an '@' left in the host means the password held one;
// a path holding an '@' followed by a ':' or a '/' means a '/' in the
// password ended the host early ("u:p/SECRET@h:5432/db" reads host "p",
// database "SECRET@h:5432/db"). A database name may hold an '@'
// ("postgres://u@h/my@db"), so one with neither after it is let through.
func reservedInURL(url string) error {
	rest, ok := strings.CutPrefix(url, "postgres://")
	if !ok {
		if rest, ok = strings.CutPrefix(url, "postgresql://"); !ok {
			return nil
		}
	}
	authority, path, hasPath := strings.Cut(rest, "/")
	host := authority
	if at := strings.IndexByte(authority, '@'); at >= 0 {
		host = authority[at+1:]
	}
	host, query, inQuery := strings.Cut(host, "?")
	if strings.Contains(host, "@") {
		return ErrReservedInURL
	}
	if !hasPath || inQuery || strings.Contains(query, "/") {
		return nil // the first '/' is the query's, not a path's
	}
	path, _, _ = strings.Cut(path, "?")
	if _, after, ok := strings.Cut(path, "@"); ok && strings.ContainsAny(after, ":/") {
		return ErrReservedInURL
	}
	return nil
}
