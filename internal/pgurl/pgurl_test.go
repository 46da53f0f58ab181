package pgurl

import (
	"errors"
	"strings"
	"testing"
)

// TestReservedCharactersInAURLAreRefused: a password holding an '@' or a
// '/' that is not percent-encoded made pgx take its tail for the host or
// the database, which connection errors then printed (an operator probe).
// Such a URL is refused, unrepeated; the encoded forms, key=value strings
// and URLs of one '@' parse as before.
func TestReservedCharactersInAURLAreRefused(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"postgres://postgres:ab@cd-SECRET@127.0.0.1:5432/postgres",
		"postgresql://postgres:p@ss/SECRET@127.0.0.1:5432/postgres?sslmode=disable",
		"postgres://u:a?b@c-SECRET@h/db",
		"postgres://u:a#b@c-SECRET@h/db",
		"postgres://u:p/SECRET@h:5432/db",
		"postgres://u:p/SECRET@h/db",
	} {
		_, err := ParseConfig(url)
		if !errors.Is(err, ErrReservedInURL) {
			t.Fatalf("%s: got %v, want ErrReservedInURL", url, err)
		}
		if strings.Contains(err.Error(), "SECRET") {
			t.Fatalf("the URL is repeated: %v", err)
		}
	}
	for _, url := range []string{
		"postgres://postgres:p%40ss%2Fword@127.0.0.1:5432/postgres",
		"postgres://postgres@127.0.0.1:5432,127.0.0.2:5433/postgres?target_session_attrs=any",
		"postgres:///postgres?host=/var/run/postgresql",
		"postgres://u@h/db?application_name=a@b",
		"host=127.0.0.1 user=postgres password=a@b/c dbname=postgres",
		"postgres://u@h/my@db",
		"postgres://u:pw@[::1]:5432/db",
		"postgres://u@h?host=/tmp&application_name=a@b:c",
		"postgres://u:pw@h1:5432,h2:5433/db?sslmode=disable",
	} {
		if _, err := ParseConfig(url); err != nil {
			t.Fatalf("%s: %v", url, err)
		}
	}
}
