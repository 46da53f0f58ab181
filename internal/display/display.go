// Package display is how the gendurable command and the dashboard show what
// they read from the database: text stored by anyone (names, states,
// payloads, error messages, an operator's cancel reason) with the characters
// that a terminal would act on, or that would show the text around them in
// another order than it is stored, written out as escapes; and an instance's
// attempts counted as operators read them.
//
// # The escaping rule
//
// One rule says which characters are escaped and how. Each of the functions
// below applies the part of it that the output it feeds does not already
// cover:
//
//   - C0 controls (U+0000–U+001F) and DEL as \xHH: [Terminal], tab, newline
//     and carriage return included, and [Page], those three left out (a
//     page's own markup and a stack trace's lines hold them; a browser
//     shows the others as nothing, and a cancel reason "paid\x01not" read
//     "paidnot" — a probe). JSON encoders and slog's handlers escape these
//     themselves.
//   - Each byte of invalid UTF-8 as \xHH: [Terminal] only.
//   - DEL (in JSON text and log values) and C1 controls (U+0080–U+009F, an
//     8-bit CSI among them) as \u00HH: [Terminal], [Page] and [Inert];
//     encoding/json and slog's JSON handler write them as they are.
//   - Bidirectional controls (the Unicode property Bidi_Control: U+202E
//     RIGHT-TO-LEFT OVERRIDE and its kin) as \uHHHH: all of them, [Page]
//     included; html/template escapes markup, not these, and
//     "acct-1<U+202E>7-tnuocca" reads "acct-1account-7".
//   - Invisible characters with no use inside a word (internal/invisible's
//     list: format characters such as the zero width space U+200B, the
//     byte order mark U+FEFF and the soft hyphen U+00AD, fillers such as
//     U+3164, the braille blank U+2800, and variation selectors but where
//     they pick the form of the character before them, as a name may hold
//     them) as \uHHHH, or \UHHHHHHHH beyond U+FFFF: [Terminal] and
//     [Page], so that a key "k<U+200B>0" does not show as "k0", another
//     key (a probe; the dashboard showed it so after the command had
//     stopped: a hostile-client probe).
//     Not the zero width joiner and non-joiner, which words and emoji
//     need, nor the tag characters of a subdivision flag (those after
//     U+1F3F4; any other is escaped), nor the emoji presentation
//     selectors U+FE0E and U+FE0F.
//
// Everything else, backslashes and right-to-left text included, is left as
// it is. Text that holds nothing to escape is returned as it was given,
// without a copy.
package display

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/internal/invisible"
)

// Terminal returns s with every character a terminal could act on made
// visible: C0 controls (tab and newline included, so a value cannot break
// a table row or forge a line) and DEL as \xHH, C1 controls as \u00HH,
// bidirectional controls and the line and paragraph separators (U+2028,
// U+2029: a line break to some terminals and editors) as \uHHHH and each
// byte of invalid UTF-8 as \xHH, and invisible format characters with no
// use inside a word (U+200B, U+FEFF, …) as \uHHHH.
// The gendurable command prints every stored value through it: a name like
// "\x1b[2J\x1b]0;pwned\a" shows as that text rather than clear the screen.
func Terminal(s string) string { return escapeString(s, terminal) }

// Inert returns s with DEL, C1 controls and bidirectional controls as
// \uHHHH: for a value a slog handler then writes, which escapes C0 controls
// and invalid UTF-8 itself (both of slog's handlers do) but, as JSON, writes
// these as they are.
func Inert(s string) string { return escapeString(s, inert) }

// InertJSON is [Inert] applied to JSON text, such as encoding/json's output
// or a JSON log line. Its escapes are JSON's own, and such characters can
// occur only inside strings, so the JSON value is unchanged.
func InertJSON(text []byte) []byte { return escapeBytes(text, inert) }

// Page returns an HTML page with its bidirectional controls, the line and
// paragraph separators and the invisible characters with no use inside a
// word as the text \uHHHH (or \UHHHHHHHH), and its C0 controls but tab,
// newline and carriage return, DEL and C1 controls as \xHH or \u00HH, as
// the command's text output shows them; nothing else changed.
// html/template escapes the markup, not these: a browser reorders text
// around the first and shows the others as nothing. The templates hold
// none, so only data is changed.
//
// In a form field's value (a value attribute's: an input's, an option's)
// the bidirectional controls, separators and invisible characters are
// written as character references (&#x200b;) instead, which the browser
// reads back as the character: a filter's field holding "pk-k\u200b0" as
// text sent that text back, and matched nothing (a review). Only there:
// every other attribute is read by the operator as text — a tooltip
// (title), the prompt a form confirms with (data-confirm) — and a
// reference in it was read back as U+202E too, so a last error's tooltip
// and a bulk cancel's prompt for a crafted filter read reordered (a
// hostile-client probe). The controls are written as text in a field too,
// as before: a reference to most of them is not read back as the
// character. A textarea's content is not taken for a field: no page fills
// one.
func Page(page []byte) []byte { return escapeBytes(page, pageSet) }

// class is what the rule makes of one character.
type class uint8

const (
	plain         class = iota // left as it is
	c0                         // U+0000–U+001F but the three below
	c0space                    // tab, newline, carriage return
	del                        // U+007F
	c1                         // U+0080–U+009F
	bidi                       // Bidi_Control
	invalid                    // a byte that is not (part of) valid UTF-8
	lineSep                    // U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR
	invisibleChar              // an invisible character with no use inside a word

	// tagRefs is no class: in a set, it writes bidi, lineSep and
	// invisibleChar inside a value attribute's value as character
	// references (Page).
	tagRefs
)

// classify classifies r, decoded from size bytes (utf8.RuneError of size 1
// is an invalid byte; of size 3, a U+FFFD that was stored as such).
func classify(r rune, size int) class {
	switch {
	case r == utf8.RuneError && size == 1:
		return invalid
	case r == '\t' || r == '\n' || r == '\r':
		return c0space
	case r < 0x20:
		return c0
	case r == 0x7f:
		return del
	case r >= 0x80 && r < 0xa0:
		return c1
	case unicode.Is(unicode.Bidi_Control, r):
		return bidi
	case r == 0x2028 || r == 0x2029:
		return lineSep
	case invisible.Escaped(r):
		return invisibleChar
	}
	return plain
}

// set is the classes one output escapes.
type set uint16

const (
	terminal set = 1<<c0 | 1<<c0space | 1<<del | 1<<c1 | 1<<bidi | 1<<invalid | 1<<lineSep | 1<<invisibleChar
	inert    set = 1<<del | 1<<c1 | 1<<bidi
	pageSet  set = 1<<c0 | 1<<del | 1<<c1 | 1<<bidi | 1<<lineSep | 1<<invisibleChar | 1<<tagRefs
)

func (s set) has(c class) bool { return s&(1<<c) != 0 }

// appendEscape appends the escape of r (of class c, whose first byte is
// first). Text for a terminal writes every ASCII control alike, as \xHH;
// JSON has only \u escapes, so where C0 controls are left to an encoder,
// DEL is \u007f.
func (s set) appendEscape(b []byte, c class, r rune, first byte) []byte {
	switch {
	case c == invalid:
		return fmt.Appendf(b, `\x%02x`, first)
	case r < utf8.RuneSelf && s.has(c0):
		return fmt.Appendf(b, `\x%02x`, r)
	case r > 0xFFFF:
		// Beyond four hex digits: Go's \UHHHHHHHH, not an ambiguous \u1d173.
		return fmt.Appendf(b, `\U%08x`, r)
	}
	return fmt.Appendf(b, `\u%04x`, r)
}

func escapeString(s string, set set) string {
	if out, changed := escape(s, set, utf8.DecodeRuneInString); changed {
		return string(out)
	}
	return s
}

func escapeBytes(p []byte, set set) []byte {
	if out, changed := escape(p, set, utf8.DecodeRune); changed {
		return out
	}
	return p
}

// escape returns s with the characters of set escaped, and true; or nil
// and false when s holds none.
func escape[T string | []byte](s T, set set, decode func(T) (rune, int)) ([]byte, bool) {
	i, prev := firstEscaped(s, set, decode)
	if i < 0 {
		return nil, false
	}
	b := make([]byte, 0, len(s)+16)
	b = append(b, s[:i]...)
	var m markup // where in a page's markup (tagRefs)
	if set.has(tagRefs) {
		for j := range i {
			m.step(s[j])
		}
	}
	for i < len(s) {
		r, size := decode(s[i:])
		c := classifyAt(s, i, r, size, prev, decode)
		if set.has(tagRefs) {
			for j := i; j < i+size; j++ {
				m.step(s[j])
			}
		}
		switch {
		case !set.has(c):
			b = append(b, s[i:i+size]...)
		case m.field && (c == bidi || c == lineSep || c == invisibleChar):
			b = fmt.Appendf(b, "&#x%x;", r)
		default:
			b = set.appendEscape(b, c, r, s[i])
		}
		prev = after(r, size, c)
		i += size
	}
	return b, true
}

// markup follows a page's markup byte by byte, far enough to tell a form
// field's value — a value attribute's, which the browser sends back as it
// reads it — from the rest of a tag and from text. html/template quotes
// every attribute value it writes and escapes the markup characters in
// data, so a '<' or '>' in text or in a quoted value is data.
type markup struct {
	inTag bool // after a '<', before its '>'
	quote byte // in a tag, the quote of the attribute value being read; ' ' for an unquoted one; 0 outside one
	name  int  // the bytes of "value" the attribute name being read has matched; -1: another name
	ended bool // the name being read has ended (white space): another begins at the next name byte
	eq    bool // the name's '=' has been read; its value is next
	field bool // in the value of a value attribute
}

func (m *markup) step(b byte) {
	const value = "value"
	space := b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == '\f'
	switch {
	case !m.inTag:
		if b == '<' {
			*m = markup{inTag: true}
		}
	case m.quote != 0:
		if b == m.quote || m.quote == ' ' && (space || b == '>') {
			*m = markup{inTag: b != '>', ended: true}
		}
	case b == '>':
		*m = markup{}
	case b == '=':
		m.eq = true
	case m.eq && (b == '"' || b == '\''):
		m.quote, m.field = b, m.name == len(value)
	case space || b == '/':
		m.ended = m.ended || !m.eq
	case m.eq:
		m.quote, m.field = ' ', m.name == len(value)
	default:
		if m.ended {
			m.name, m.ended = 0, false
		}
		if m.name >= 0 && m.name < len(value) && b|0x20 == value[m.name] {
			m.name++
		} else {
			m.name = -1
		}
	}
}

// classifyAt classifies r, decoded from size bytes at offset i of s after
// prev (-1 at the start): as classify, but a variation selector that
// selects a form of the character before it (invisible.Selects: a
// Mongolian letter's, an ideograph's, a keycap's) is plain, as a name may
// hold it — a name the library accepts printed with \u180b in it.
func classifyAt[T string | []byte](s T, i int, r rune, size int, prev rune, decode func(T) (rune, int)) class {
	c := classify(r, size)
	if r >= 0xE0000 && r <= 0xE007F && !(isTag(r) && (prev == blackFlag || isTag(prev))) {
		// A tag character outside a subdivision flag (U+1F3F4 and the
		// tags after it), and the tag block's others (U+E0001 LANGUAGE
		// TAG, unassigned ones): "acct-9<U+E0031>" printed as "acct-9",
		// as another key does (an operator probe). prev is a tag only
		// when that tag was left as it is (escape, firstEscaped).
		return invisibleChar
	}
	if c == invisibleChar && unicode.Is(unicode.Variation_Selector, r) {
		next := rune(-1)
		if i+size < len(s) {
			next, _ = decode(s[i+size:])
		}
		if invisible.Selects(prev, next) {
			return plain
		}
	}
	return c
}

// after is the character a variation selector or a tag next would follow:
// r, or -1 for an invalid byte (printed as an escape, it has no form to
// pick) and for a tag printed as an escape (it begins no flag's tags).
func after(r rune, size int, c class) rune {
	if r == utf8.RuneError && size == 1 || isTag(r) && c == invisibleChar {
		return -1
	}
	return r
}

// blackFlag is U+1F3F4 WAVING BLACK FLAG, which a subdivision flag's tag
// characters follow (England's: U+1F3F4 U+E0067 U+E0062 … U+E007F).
const blackFlag = 0x1F3F4

// isTag reports the tag characters U+E0020–U+E007F.
func isTag(r rune) bool { return r >= 0xE0020 && r <= 0xE007F }

// firstEscaped is the offset of the first character of s that set escapes,
// or -1, and the character before it (as classifyAt takes it). ASCII, most
// of any text, is judged byte by byte.
func firstEscaped[T string | []byte](s T, set set, decode func(T) (rune, int)) (int, rune) {
	prev := rune(-1)
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if (c < 0x20 && set.has(classify(rune(c), 1))) || (c == 0x7f && set.has(del)) {
				return i, prev
			}
			prev = rune(c)
			i++
			continue
		}
		r, size := decode(s[i:])
		c := classifyAt(s, i, r, size, prev, decode)
		if set.has(c) {
			return i, prev
		}
		prev = after(r, size, c)
		i += size
	}
	return -1, prev
}

// Count is n and noun in agreement, for operators' messages: "1 receipt",
// "3 receipts", "2 carrier retries" (a noun ending in y takes -ies).
func Count[N int | int64](n N, noun string) string {
	switch {
	case n == 1:
		return "1 " + noun
	case strings.HasSuffix(noun, "y"):
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(noun, "y"))
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// Attempt is an attempt as operators read it: counted from 1 ("attempt 1
// of 3" is the first run), where the Go API and JSON count from 0, the
// failed attempts before this run.
func Attempt(attempt int) int { return attempt + 1 }

// Run is the run an instance is on, shown beside its max attempts ("run of
// max"): [Attempt], except for an instance the reaper of an engine built
// before schema version 21 failed after its last lease expired, whose
// attempt count it raised to max attempts (such engines may still run
// beside newer ones through an upgrade): its last run shows as "3 of 3",
// not "4 of 3" (the reaper has kept the attempt it fails a row on since).
// Only
// that case: a step that replayed past its budget ([gendurable.Run.Replay]
// is not stopped by it) is on its 6th run at attempt 5 and shows "6 of 3",
// not "3 of 3".
func Run(attempt, maxAttempts int, status gendurable.Status) int {
	if status == gendurable.StatusFailed && maxAttempts > 0 && attempt == maxAttempts {
		return maxAttempts
	}
	return Attempt(attempt)
}
