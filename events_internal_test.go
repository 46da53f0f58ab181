package gendurable

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/gendurable/gendurable/internal/executor"
	"github.com/gendurable/gendurable/internal/sqlq"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestAnOutcomeLostToTheConnectionIsNotLoggedAsRefused: PgBouncer's login
// refused (SQLSTATE 08P01) or a server shutting down (57P01) failed the
// connection, not the statement; the log said "the database refused it" (a
// fault probe behind PgBouncer).
func TestAnOutcomeLostToTheConnectionIsNotLoggedAsRefused(t *testing.T) {
	for code, want := range map[string]string{
		"08P01": "failed the connection",
		"57P01": "failed the connection",
		"22P05": "the database refused it",
		// A WithTx step frozen past idle_in_transaction_session_timeout:
		// the session ended, the outcome was not refused (a crash probe).
		"25P03": "the database ended the session (terminating connection due to idle-in-transaction timeout)",
		"25P04": "the database ended the session (Verbindung wird abgebrochen)",
		"":      "it may have been written", // a network error: the answer was lost
	} {
		var logs strings.Builder
		e := &Engine{log: slog.New(slog.NewTextHandler(&logs, nil))}
		c := &sqlq.Claimed{ID: 1, FSM: "m", Step: "a"}
		res := &executor.Result{Out: sqlq.Outcome{Kind: sqlq.KindDone}}
		pgErr := &pgconn.PgError{Code: code, Message: "x", Severity: "ERROR"}
		switch code {
		case "25P03":
			pgErr.Severity, pgErr.Message = "FATAL", "terminating connection due to idle-in-transaction timeout"
		case "25P04": // a server whose lc_messages is German: Severity translated
			pgErr.Severity, pgErr.SeverityUnlocalized, pgErr.Message = "SCHWERWIEGEND", "FATAL", "Verbindung wird abgebrochen"
		}
		err := errors.Join(errors.New("commit"), pgErr)
		if code == "" {
			err = errors.Join(errors.New("commit"), io.ErrUnexpectedEOF)
		}
		execEvents{e}.Step(context.Background(), "q", c, res, false, err, 0)
		if !strings.Contains(logs.String(), want) {
			t.Errorf("%s: %q does not say %q", code, logs.String(), want)
		}
	}
}

// TestAnOutcomeAPoolerRefusedSaysWhatToChange: behind PgBouncer in
// transaction pooling with pgx's statement cache (or describe_exec), an
// outcome refused for a prepared statement the server session did not
// know was logged "the database refused it" with no advice (describe_exec's
// 08P01 as "failed the connection"), though the picks' warnings carried
// it (a PgBouncer probe).
func TestAnOutcomeAPoolerRefusedSaysWhatToChange(t *testing.T) {
	for _, pgErr := range []*pgconn.PgError{
		{Code: "42P05", Severity: "ERROR", Message: `prepared statement "stmtcache_1" already exists`},
		{Code: "26000", Severity: "ERROR", Message: `prepared statement "stmtcache_2" does not exist`},
		{Code: "08P01", Severity: "ERROR", Message: `bind message supplies 3 parameters, but prepared statement "" requires 1`},
	} {
		var logs strings.Builder
		e := &Engine{log: slog.New(slog.NewTextHandler(&logs, nil))}
		c := &sqlq.Claimed{ID: 1, FSM: "m", Step: "a"}
		res := &executor.Result{Out: sqlq.Outcome{Kind: sqlq.KindDone}}
		execEvents{e}.Step(context.Background(), "q", c, res, false, errors.Join(errors.New("outcome"), pgErr), 0)
		for _, want := range []string{"outcome not written (the database refused it)", "default_query_exec_mode=cache_describe"} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("%s: %q does not say %q", pgErr.Message, logs.String(), want)
			}
		}
	}
}

// TestAHeartbeatAPoolerRefusedSaysWhatToChange: the heartbeat's warning
// carries the pooler advice, as the picks' do (a PgBouncer probe: with
// pgx's statement cache behind transaction pooling the heartbeats failed
// with a bare 26000 while leases were lost).
func TestAHeartbeatAPoolerRefusedSaysWhatToChange(t *testing.T) {
	var logs strings.Builder
	e := &Engine{log: slog.New(slog.NewTextHandler(&logs, nil))}
	(&schedEvents{e: e}).HeartbeatFailed("q", &pgconn.PgError{Code: "26000", Severity: "ERROR", Message: `prepared statement "stmtcache_3" does not exist`})
	if !strings.Contains(logs.String(), "default_query_exec_mode=cache_describe") {
		t.Errorf("%q gives no advice", logs.String())
	}
}
