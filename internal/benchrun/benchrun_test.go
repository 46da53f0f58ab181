package benchrun

import (
	"strings"
	"testing"
)

// TestStatementKindIsTheFirstThreeWords: the statement counter names a
// statement by its first three words, whatever whitespace separates them,
// as splitting the whole text did.
func TestStatementKindIsTheFirstThreeWords(t *testing.T) {
	for _, sql := range []string{
		"",
		"   ",
		"SELECT 1",
		"COMMIT",
		"\n\tWITH locked AS MATERIALIZED (\n  -- a comment\n  SELECT 1)",
		"SELECT  p.next_cursor,\r\np.keys_full FROM x",
		"INSERT INTO t VALUES ($1)   ",
	} {
		f := strings.Fields(sql)
		want := strings.Join(f[:min(3, len(f))], " ")
		if got := statementKind(sql); got != want {
			t.Errorf("statementKind(%q) = %q, want %q", sql, got, want)
		}
	}
}
