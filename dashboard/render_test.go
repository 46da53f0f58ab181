package dashboard_test

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"testing"
	"unicode"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// requireNoBidi fails if body holds a bidirectional control character.
func requireNoBidi(t *testing.T, what, body string) {
	t.Helper()
	for _, r := range body {
		require.False(t, unicode.Is(unicode.Bidi_Control, r), "%s: bidirectional control %U on the page", what, r)
	}
}

// TestBidiControlsInStoredTextAreShownAsEscapes: html/template escapes
// markup but not U+202E RIGHT-TO-LEFT OVERRIDE and its kin, so a state, a
// signal payload, an error message or a cancel reason holding one showed
// the text after it reversed: "acct-1<U+202E>7-tnuocca" read
// "acct-1account-7" on the instance page and in the list's last error.
// Pages now write each as the text \u202e.
func TestBidiControlsInStoredTextAreShownAsEscapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	const evil = "acct-1\u202e7-tnuocca \u2067x\u2069"
	id := e.insertOrder(Order{Item: evil, Secret: "s"})
	_, err := e.eng.Signal(context.Background(), id, "note", map[string]string{"who": evil}, nil)
	require.NoError(t, err)
	require.NoError(t, e.eng.Cancel(context.Background(), id, "refund "+evil))
	for _, p := range []string{fmt.Sprintf("/instances/%d", id), "/instances", "/instances?status=failed"} {
		r := get(t, h, p)
		require.Equal(t, 200, r.code, r.body)
		requireNoBidi(t, p, r.body)
		require.Contains(t, r.body, `acct-1\u202e7-tnuocca \u2067x\u2069`, p)
	}
}

// TestInvisibleCharactersAreShownAsEscapes: keys and stored text may hold
// invisible characters (U+200B, U+FEFF, U+2060, …), which a browser shows
// as nothing: an instance keyed "pk-k<U+200B>0" showed as "pk-k0", another
// instance's key, while the CLI printed it escaped (a hostile-client
// probe). Pages now write them as the CLI does.
func TestInvisibleCharactersAreShownAsEscapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	plain := e.insertOrder(Order{Item: "a"}, gendurable.InsertOpts{PartitionKey: "pk-k0", UniqueKey: "uk-k0"})
	hidden := e.insertOrder(Order{Item: "zw\u200bsp\ufeff"}, gendurable.InsertOpts{PartitionKey: "pk-k\u200b0", UniqueKey: "uk-k\u20600"})
	require.NoError(t, e.eng.Cancel(context.Background(), hidden, "paid\u2028not\u00ad"))
	r := get(t, h, fmt.Sprintf("/instances/%d", hidden))
	require.Equal(t, 200, r.code, r.body)
	for _, want := range []string{`pk-k\u200b0`, `uk-k\u20600`, `zw\u200bsp\ufeff`, `paid\u2028not\u00ad`} {
		require.Contains(t, r.body, want)
	}
	require.NotContains(t, r.body, "pk-k0", "the key shows as another key")
	for _, c := range []string{"\u200b", "\ufeff", "\u2060", "\u2028", "\u00ad"} {
		require.NotContains(t, r.body, c, "raw %U on the page", []rune(c)[0])
	}
	require.Contains(t, get(t, h, fmt.Sprintf("/instances/%d", plain)).body, "pk-k0")
	// In a form's field the character itself, as a reference the browser
	// reads back: the filter sends what the operator searched for (a
	// review: the escape as text went back, and matched nothing).
	r = get(t, h, "/instances?q=pk-k%E2%80%8B0")
	require.Equal(t, 200, r.code, r.body)
	require.Contains(t, r.body, `value="pk-k&#x200b;0"`)
	require.Contains(t, r.body, fmt.Sprintf(`href="/instances/%d"`, hidden), "the search finds the key")
}

// TestBidiControlsInAttributesAreShownAsEscapes: a tooltip and a
// confirmation prompt are read by the operator as text, but the page wrote
// bidirectional controls in every attribute as character references, which
// the browser reads back as U+202E: the list's "Last error" tooltip (title)
// and the prompt of "Cancel all live" (data-confirm, its filter taken from
// a link anyone can craft) read reordered (a hostile-client probe). Only a
// form field's value keeps the character, so the filter still sends what
// was searched for.
func TestBidiControlsInAttributesAreShownAsEscapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	id := e.insertOrder(Order{Item: "\u202eab"}, gendurable.InsertOpts{PartitionKey: "pk-k\u200b0"})
	require.NoError(t, e.eng.Cancel(context.Background(), id, "x\u202e{{.}}\x1b[31m"))
	r := get(t, h, "/instances?"+url.Values{"status": {"failed"}, "q": {"pk-k\u200b0"}, "state": {"{\"item\":\"\u202eab\"}"}}.Encode())
	require.Equal(t, 200, r.code, r.body)
	requireNoBidi(t, "list", r.body)
	require.Contains(t, r.body, fmt.Sprintf(`href="/instances/%d"`, id), "the filter finds the instance")
	require.Contains(t, r.body, `<td class="err" title="x\u202e{{.}}\x1b[31m">`)
	require.Contains(t, r.body, `data-confirm="Cancel every live instance matching this filter (status=failed q=pk-k\u200b0 state={&#34;item&#34;:&#34;\u202eab&#34;}), `)
	// The search fields, and the bulk form's copies of them, as sent.
	require.Contains(t, r.body, `<input name="q" value="pk-k&#x200b;0"`)
	require.Contains(t, r.body, `<input name="state" value="{&#34;item&#34;:&#34;&#x202e;ab&#34;}"`)
	require.Contains(t, r.body, `<input type="hidden" name="state" value="{&#34;item&#34;:&#34;&#x202e;ab&#34;}">`)
	// A reference anywhere else, in any attribute but a value, is read back.
	for _, m := range regexp.MustCompile(`([\w-]+)="[^"]*&#x`).FindAllStringSubmatch(r.body, -1) {
		require.Equal(t, "value", m[1], "a character reference in an attribute the operator reads: %s", m[0])
	}
}

// TestControlCharactersInStoredTextAreShownAsEscapes: a cancel reason (or
// a state, a payload, an error) may hold C0 and C1 controls — the API and
// the CLI keep them, shown escaped — and a browser shows them as nothing:
// "paid\x01\x1b\u009bnot" read "paidnot" on the instance page, while the
// CLI printed it escaped (a hostile-operator probe). Pages now write them
// as the CLI does; tab and newline, which a stack trace's lines and the
// page's markup hold, stay.
func TestControlCharactersInStoredTextAreShownAsEscapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{})
	id := e.insertOrder(Order{Item: "ink\x1b[31mred\x7f", Secret: "s"})
	require.NoError(t, e.eng.Cancel(context.Background(), id, "paid\x01\x1b\u009bnot"))
	for _, p := range []string{fmt.Sprintf("/instances/%d", id), "/instances?status=failed"} {
		r := get(t, h, p)
		require.Equal(t, 200, r.code, r.body)
		require.Contains(t, r.body, `paid\x01\x1b\u009bnot`, p)
		for _, c := range r.body {
			require.False(t, c < 0x20 && c != '\t' && c != '\n' && c != '\r' || c == 0x7f || c >= 0x80 && c < 0xa0,
				"%s: control character %U on the page", p, c)
		}
	}
	// The state is JSON: its own escape for ESC, the page's for DEL.
	require.Contains(t, get(t, h, fmt.Sprintf("/instances/%d", id)).body, `ink\u001b[31mred\x7f`)
}
