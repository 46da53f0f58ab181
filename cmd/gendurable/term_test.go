package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/dbtest"
	"github.com/stretchr/testify/require"
)

// TestOneLine: oneLine folds white space, cuts at a character boundary,
// never inside one, and escapes what is left (internal/display's
// TestEscapingRule holds the escaping rule itself).
func TestOneLine(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ab…", oneLine("abé", 3))
	require.Equal(t, "a b…", oneLine("a \n b\x1bc", 3))
	require.Equal(t, `a \x1b…`, oneLine("a \x1bbc", 3))
	require.Equal(t, `a b \u202ec`, oneLine("a\tb \u202ec", 100))
}

// requireInert fails unless out is valid UTF-8 whose only control character
// is the newline: nothing in it can drive a terminal.
func requireInert(t *testing.T, out string) {
	t.Helper()
	require.True(t, utf8.ValidString(out), "invalid UTF-8 in %q", out)
	for _, r := range out {
		require.False(t, (r < 0x20 && r != '\n') || (r >= 0x7f && r < 0xa0), "control character %U in output %q", r, out)
	}
}

// TestHostileNamesAreEscaped: names, states, payloads and errors that carry
// terminal escapes (a signal named "\e[2J\e[31mFAKE\e]0;pwned\a" once cleared
// the screen from `show`) come out of show, list and status, as text and as
// JSON, with no control character left in them.
func TestHostileNamesAreEscaped(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	const evil = "\x1b[2J\x1b[31mFAKE\x1b]0;pwned\x07\u009b1m\x7f\ttab\nline"
	const shown = `\x1b[2J\x1b[31mFAKE\x1b]0;pwned\x07\u009b1m\x7f\x09tab\x0aline`
	s := `"` + schema + `"`
	hostileJSON, err := json.Marshal(map[string]string{"note": evil})
	require.NoError(t, err)
	errs, err := json.Marshal([]map[string]any{{"step": evil, "attempt": 1, "at": "2026-01-01T00:00:00Z", "kind": evil, "error": evil}})
	require.NoError(t, err)
	var parent int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances
		(fsm, queue, step, state, status, partition_key, awaits, errors)
		VALUES ($1, $1, $1, $2, 'awaiting_signal', $1, ARRAY[$1], $3) RETURNING id`, evil, hostileJSON, errs).Scan(&parent))
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_instances (fsm, queue, step, result, status, parent_id, finished_at)
		VALUES ($1, $1, $1, $2, 'done', $3, now())`, evil, hostileJSON, parent)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_signals (target_id, name, payload) VALUES ($1, $2, $3)`, parent, evil, hostileJSON)
	require.NoError(t, err)

	id := fmt.Sprint(parent)
	var out string
	for _, args := range [][]string{{"show", id}, {"list"}, {"status"}} {
		var errOut string
		var code int
		out, errOut, code = cli(t, append(args, "--schema", schema)...)
		require.Equal(t, 0, code, errOut)
		requireInert(t, out)
		require.Contains(t, out, shown[:40], "%s shows the escaped text", args[0])
		require.Contains(t, out, `FAKE\x1b]0;pwned\x07`)

		out, errOut, code = cli(t, append(args, "--schema", schema, "--json")...)
		require.Equal(t, 0, code, errOut)
		requireInert(t, strings.ReplaceAll(out, "\n", ""))
		require.True(t, json.Valid([]byte(out)), out)
		require.Contains(t, out, "FAKE", "%s --json", args[0])
		require.Contains(t, out, `\u009b1m`, "C1 controls in JSON strings and jsonb values are escaped")
	}
	out, _, _ = cli(t, "show", id, "--schema", schema)
	for _, line := range []string{"instance ", "status   ", "waiting  ", "key      ", "state    ", "error    ", "signal   ", "child    "} {
		require.Contains(t, out, line)
	}
	require.Equal(t, 8, strings.Count(out, "\n"), "a newline in a value cannot forge a line:\n%s", out)

	// A refused command's output is inert too: a hostile queue name is
	// invalid input, refused before any SQL.
	out, errOut, code := cli(t, "pause", evil, "--schema", schema)
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "invalid input")
	requireInert(t, out)
	requireInert(t, errOut)
}

// requireNoBidi fails if out holds a bidirectional control character.
func requireNoBidi(t *testing.T, out string) {
	t.Helper()
	for _, r := range out {
		require.False(t, unicode.Is(unicode.Bidi_Control, r), "bidirectional control %U in output %q", r, out)
	}
}

// TestBidiControlsAreEscaped: a bidirectional control (U+202E
// RIGHT-TO-LEFT OVERRIDE, U+2066 LEFT-TO-RIGHT ISOLATE, ...) in stored text
// — a step's error message, a state, a signal payload, or a name stored
// before names refused them — shows the text after it reversed on the
// operator's terminal: "acct-1<U+202E>7-tnuocca" reads "acct-1account-7".
// show and list print it as \u202e, as text and as JSON; and the JSON log
// lines on stderr (a cancel's reason, under ui a dashboard user's input)
// carry no DEL, C1 or bidirectional control either.
func TestBidiControlsAreEscaped(t *testing.T) {
	t.Parallel()
	pool, schema := dbtest.NewSchema(t, &dbtest.Options{MaxConns: 2})
	ctx := context.Background()
	const evil = "acct-1\u202e7-tnuocca"
	s := `"` + schema + `"`
	state, err := json.Marshal(map[string]string{"customer": evil})
	require.NoError(t, err)
	errs, err := json.Marshal([]map[string]any{{"step": "charge", "attempt": 0, "at": "2026-01-01T00:00:00Z", "kind": "error", "error": "declined for " + evil}})
	require.NoError(t, err)
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+s+`.gendurable_instances
		(fsm, queue, step, state, status, partition_key, awaits, errors)
		VALUES ('order', 'default', 'charge', $2, 'awaiting_signal', $1, ARRAY['pay'], $3) RETURNING id`, evil, state, errs).Scan(&id))
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.gendurable_signals (target_id, name, payload) VALUES ($1, 'note', $2)`, id, state)
	require.NoError(t, err)

	for _, args := range [][]string{{"show", fmt.Sprint(id)}, {"list"}} {
		for _, asJSON := range []bool{false, true} {
			a := append(args, "--schema", schema)
			if asJSON {
				a = append(a, "--json")
			}
			out, errOut, code := cli(t, a...)
			require.Equal(t, 0, code, errOut)
			requireNoBidi(t, out)
			require.Contains(t, out, `acct-1\u202e7-tnuocca`, "%v shows the override as an escape", a)
			if asJSON {
				require.True(t, json.Valid([]byte(out)), out)
			}
		}
	}

	// A cancel's reason is free text, kept as given (show escapes it); the
	// JSON audit line on stderr escapes it too.
	out, errOut, code := cli(t, "cancel", fmt.Sprint(id), "--reason", "refund \u009b2J "+evil+" \x7f", "--schema", schema, "--json")
	require.Equal(t, 0, code, errOut)
	requireInert(t, strings.ReplaceAll(errOut, "\n", ""))
	requireNoBidi(t, errOut)
	require.Contains(t, errOut, `refund \u009b2J acct-1\u202e7-tnuocca \u007f`)
	requireInert(t, out)
}

// TestPrintJSONDoesNotIndentDeepValues: JSON output holding a value nested
// 1,000 levels deep is written compact (indented, it grows about a
// thousandfold: each line carries its depth); ordinary output is indented.
func TestPrintJSONDoesNotIndentDeepValues(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, printJSON(&out, map[string]any{"state": json.RawMessage(`{"a": [1]}`)}))
	require.Equal(t, "{\n  \"state\": {\n    \"a\": [\n      1\n    ]\n  }\n}\n", out.String())

	out.Reset()
	deep := strings.Repeat("[", 999) + strings.Repeat("0,", 2000) + "0" + strings.Repeat("]", 999)
	require.NoError(t, printJSON(&out, map[string]any{"state": json.RawMessage(deep)}))
	require.Equal(t, `{"state":`+deep+"}\n", out.String())
}
