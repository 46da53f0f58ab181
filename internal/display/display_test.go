package display

import (
	"testing"

	"github.com/gendurable/gendurable"
	"github.com/stretchr/testify/require"
)

// TestEscapingRule is the rule, whole: for each input, what the terminal
// (Terminal), slog values and JSON text (Inert, InertJSON) and HTML pages
// (Page) get. Text with nothing to escape is returned as it was.
func TestEscapingRule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in              string
		terminal, inert, page string
	}{
		{name: "plain", in: "plain name",
			terminal: "plain name", inert: "plain name", page: "plain name"},
		{name: "letters beyond ASCII", in: "ünïcødé ✓ 日本 \U0001F600",
			terminal: "ünïcødé ✓ 日本 \U0001F600", inert: "ünïcødé ✓ 日本 \U0001F600", page: "ünïcødé ✓ 日本 \U0001F600"},
		{name: "backslashes stay", in: `back\slash \u202e`,
			terminal: `back\slash \u202e`, inert: `back\slash \u202e`, page: `back\slash \u202e`},
		{name: "right-to-left text stays", in: "שלום مرحبا",
			terminal: "שלום مرحبا", inert: "שלום مرحبا", page: "שלום مرحبا"},
		{name: "no-break space and U+FFFD stay", in: "nbsp\u00a0ok \ufffd",
			terminal: "nbsp\u00a0ok \ufffd", inert: "nbsp\u00a0ok \ufffd", page: "nbsp\u00a0ok \ufffd"},
		{name: "terminal escapes", in: "\x1b[2J\x1b[31mFAKE\x1b]0;pwned\x07",
			terminal: `\x1b[2J\x1b[31mFAKE\x1b]0;pwned\x07`, inert: "\x1b[2J\x1b[31mFAKE\x1b]0;pwned\x07", page: `\x1b[2J\x1b[31mFAKE\x1b]0;pwned\x07`},
		{name: "white space controls", in: "tab\tnew\nline\r",
			terminal: `tab\x09new\x0aline\x0d`, inert: "tab\tnew\nline\r", page: "tab\tnew\nline\r"},
		{name: "NUL and DEL", in: "nul\x00del\x7f",
			terminal: `nul\x00del\x7f`, inert: "nul\x00del\\u007f", page: `nul\x00del\x7f`},
		{name: "C1 controls", in: "c1 \u009b31m \u0085 \u0080\u009f",
			terminal: `c1 \u009b31m \u0085 \u0080\u009f`, inert: `c1 \u009b31m \u0085 \u0080\u009f`, page: `c1 \u009b31m \u0085 \u0080\u009f`},
		{name: "bidirectional controls", in: "acct-1\u202e7-tnuocca \u2066x\u2069 \u200f\u200e\u061c\u202a",
			terminal: `acct-1\u202e7-tnuocca \u2066x\u2069 \u200f\u200e\u061c\u202a`,
			inert:    `acct-1\u202e7-tnuocca \u2066x\u2069 \u200f\u200e\u061c\u202a`,
			page:     `acct-1\u202e7-tnuocca \u2066x\u2069 \u200f\u200e\u061c\u202a`},
		{name: "line and paragraph separators", in: "q\u2028FAKE\u2029x",
			terminal: `q\u2028FAKE\u2029x`, inert: "q\u2028FAKE\u2029x", page: `q\u2028FAKE\u2029x`},
		{name: "invisible characters", in: "k\u200b0 \ufeffbom soft\u00adhyphen \u2060wj",
			terminal: `k\u200b0 \ufeffbom soft\u00adhyphen \u2060wj`,
			inert:    "k\u200b0 \ufeffbom soft\u00adhyphen \u2060wj",
			page:     `k\u200b0 \ufeffbom soft\u00adhyphen \u2060wj`},
		{name: "fillers, blanks and other format characters", in: "pay\u206f default\u3164 q\U0001d173 x\u2800 k\ufe00",
			terminal: `pay\u206f default\u3164 q\U0001d173 x\u2800 k\ufe00`,
			inert:    "pay\u206f default\u3164 q\U0001d173 x\u2800 k\ufe00",
			page:     `pay\u206f default\u3164 q\U0001d173 x\u2800 k\ufe00`},
		{name: "a variation selector that picks a form stays, as a name may hold it", in: "\u1824\u180b\u1820 \u845b\U000E0100\u57ce \x1b\u845b\U000E0100",
			terminal: "\u1824\u180b\u1820 \u845b\U000E0100\u57ce \\x1b\u845b\U000E0100",
			inert:    "\u1824\u180b\u1820 \u845b\U000E0100\u57ce \x1b\u845b\U000E0100",
			page:     "\u1824\u180b\u1820 \u845b\U000E0100\u57ce \\x1b\u845b\U000E0100"},
		{name: "a variation selector with no form to pick is escaped", in: "\ufe00x x\U000E0100 \u200b\ufe01 \xe8\ufe02 1\ufe03",
			terminal: `\ufe00x x\U000e0100 \u200b\ufe01 \xe8\ufe02 1\ufe03`,
			inert:    "\ufe00x x\U000E0100 \u200b\ufe01 \xe8\ufe02 1\ufe03",
			page:     `\ufe00x x\U000e0100 \u200b\ufe01 ` + "\xe8" + `\ufe02 1\ufe03`},
		{name: "emoji presentation selectors stay", in: "\u2764\ufe0f \u2764\ufe0e",
			terminal: "\u2764\ufe0f \u2764\ufe0e", inert: "\u2764\ufe0f \u2764\ufe0e", page: "\u2764\ufe0f \u2764\ufe0e"},
		{name: "a subdivision flag's tags stay", in: "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",
			terminal: "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",
			inert:    "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",
			page:     "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F"},
		// Tags anywhere else hide: "acct-9<U+E0031>" printed as "acct-9",
		// as another key does (an operator probe).
		{name: "tags outside a flag are escaped", in: "acct-9\U000E0031\U000E0032 x\U000E007F y\U000E0001 \U0001F3F4\U000E0001",
			terminal: `acct-9\U000e0031\U000e0032 x\U000e007f y\U000e0001 ` + "\U0001F3F4" + `\U000e0001`,
			inert:    "acct-9\U000E0031\U000E0032 x\U000E007F y\U000E0001 \U0001F3F4\U000E0001",
			page:     `acct-9\U000e0031\U000e0032 x\U000e007f y\U000e0001 ` + "\U0001F3F4" + `\U000e0001`},
		{name: "joiners stay", in: "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \U0001F468\u200d\U0001F469",
			terminal: "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \U0001F468\u200d\U0001F469",
			inert:    "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \U0001F468\u200d\U0001F469",
			page:     "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \U0001F468\u200d\U0001F469"},
		{name: "invalid UTF-8", in: "bad \xff\xfe utf8 \xc2",
			terminal: `bad \xff\xfe utf8 \xc2`, inert: "bad \xff\xfe utf8 \xc2", page: "bad \xff\xfe utf8 \xc2"},
		{name: "a bidi control after invalid UTF-8", in: "\xe2\x80\u202e",
			terminal: `\xe2\x80\u202e`, inert: "\xe2\x80\\u202e", page: "\xe2\x80\\u202e"},
		{name: "everything at once", in: "\x1b\u009b\u202e\x7f\xff",
			terminal: `\x1b\u009b\u202e\x7f\xff`, inert: "\x1b\\u009b\\u202e\\u007f\xff", page: `\x1b\u009b\u202e\x7f` + "\xff"},
	} {
		require.Equal(t, tc.terminal, Terminal(tc.in), "Terminal: %s: %q", tc.name, tc.in)
		require.Equal(t, tc.inert, Inert(tc.in), "Inert: %s: %q", tc.name, tc.in)
		require.Equal(t, tc.inert, string(InertJSON([]byte(tc.in))), "InertJSON: %s: %q", tc.name, tc.in)
		require.Equal(t, tc.page, string(Page([]byte(tc.in))), "Page: %s: %q", tc.name, tc.in)
	}
	// In a form field's value (a value attribute's), separators,
	// bidirectional controls and invisible characters are character
	// references, which a browser reads back as the character (the field
	// sends it as stored); controls stay text; outside tags, text as above.
	require.Equal(t, `<input value="pk-k&#x200b;0 &#x202e;x &#x2028; \x01">pk-k\u200b0 \u202ex`,
		string(Page([]byte("<input value=\"pk-k\u200b0 \u202ex \u2028 \x01\">pk-k\u200b0 \u202ex"))))
	// Every other attribute is text the operator reads, a tooltip or a
	// confirmation prompt: there a reference was read back as U+202E, and
	// the text reordered (a hostile-client probe).
	for in, want := range map[string]string{
		"<a title=\"\U0001d173\">\U0001d173</a>":                                                     `<a title="\U0001d173">\U0001d173</a>`,
		"<td class=\"err\" title=\"x\u202e{{.}}\x1b[31m\">":                                          `<td class="err" title="x\u202e{{.}}\x1b[31m">`,
		"<button value=\"match\" data-confirm=\"Cancel (state={&#34;x&#34;:&#34;\u202eab&#34;})?\">": `<button value="match" data-confirm="Cancel (state={&#34;x&#34;:&#34;\u202eab&#34;})?">`,
		"<input data-value=\"\u202e\" values=\"\u202e\" title=\"value=\u202e\">":                     `<input data-value="\u202e" values="\u202e" title="value=\u202e">`,
		// html/template quotes with ", a template may with '; a '>' in a
		// quoted value ends no tag; names are read without case.
		"<input placeholder='a>b' VALUE = '\u202e' title=\"\u202e\">":       `<input placeholder='a>b' VALUE = '&#x202e;' title="\u202e">`,
		"<option value=\"\u200b\" selected>\u200b</option>":                 `<option value="&#x200b;" selected>\u200b</option>`,
		"<input value=\u202e title=\u202e><input checked value=\"\u202e\">": `<input value=&#x202e; title=\u202e><input checked value="&#x202e;">`,
		"<p>value=\"\u202e\"</p><input value=\"\" title=\"\u202e\">":        `<p>value="\u202e"</p><input value="" title="\u202e">`,
	} {
		require.Equal(t, want, string(Page([]byte(in))), "%q", in)
	}
	// Nothing to escape: the same bytes back, not a copy.
	page := []byte("<p>nothing to escape\n\t</p>")
	require.Same(t, &page[0], &Page(page)[0])
	require.Same(t, &page[0], &InertJSON(page)[0])
}

// TestAttemptsAsShown: attempts count from 1; the run an instance is on is
// its attempt counted from 1, except for one the reaper failed after its
// last lease expired (attempt = max attempts): "3 of 3", not "4 of 3".
func TestAttemptsAsShown(t *testing.T) {
	t.Parallel()
	require.Equal(t, 1, Attempt(0))
	require.Equal(t, 3, Attempt(2))
	for _, tc := range []struct {
		attempt, max int
		status       gendurable.Status
		want         int
	}{
		{0, 3, gendurable.StatusRunnable, 1},
		{1, 3, gendurable.StatusRunnable, 2},
		{2, 3, gendurable.StatusFailed, 3},   // failed by its step on its last run
		{3, 3, gendurable.StatusFailed, 3},   // failed by the reaper: it counted the expired run
		{3, 3, gendurable.StatusRunnable, 4}, // only a failed instance
		{5, 3, gendurable.StatusRunnable, 6}, // replayed past its budget
		{5, 3, gendurable.StatusFailed, 6},
		{0, 0, gendurable.StatusFailed, 1}, // no max attempts recorded
	} {
		require.Equal(t, tc.want, Run(tc.attempt, tc.max, tc.status), "%+v", tc)
	}
}

// TestCount: a count agrees with its noun (the demo printed "1 checkouts",
// the CLI "1 ids").
func TestCount(t *testing.T) {
	for want, got := range map[string]string{
		"1 receipt": Count(1, "receipt"), "0 receipts": Count(0, "receipt"), "3 ids": Count(int64(3), "id"),
		"1 carrier retry": Count(1, "carrier retry"), "2 carrier retries": Count(2, "carrier retry"),
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}
