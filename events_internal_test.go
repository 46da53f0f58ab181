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
