package gendurable

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/invisible"
)

// Names and keys are checked by one rule wherever they come in — config,
// inserts, the admin API, the CLI and the dashboard — so that what an insert
// accepts an operator can also filter, pause or remove, and what an
// operator cannot type no insert can store.
const (
	maxNameLen  = 200  // queue, machine and step names
	maxKeyLen   = 1000 // partition, unique and dedup keys, search text
	maxKeyLimit = 1 << 20
	// maxQueueWindow bounds a queue's Concurrency + Prefetch: a pick's
	// batch, which the pick takes as an int4 (and its bound of keys, 4 × it).
	maxQueueWindow = 1 << 20
	// maxConcurrency bounds a queue's Concurrency: its feeder starts a
	// worker goroutine per place.
	maxConcurrency = 1 << 16
	// minTimestampYear, maxTimestampYear: the years (UTC, 0 being 1 BC) of
	// the times an insert or a filter may give (InsertOpts.RunAt,
	// ListFilter.From and To), within PostgreSQL's timestamptz range (4713
	// BC to 294276 AD).
	minTimestampYear = -4712
	maxTimestampYear = 294275
)

// minRunAt, maxRunAt bound an InsertOpts.RunAt, narrower than the
// database's times: a row's times are written out as RFC 3339 (list
// --json, show --json, encoding/json of InstanceSummary and
// InstanceDetail), which has four-digit years, in the reader's time zone
// (pgx reads timestamptz in local time) — one row of the year 294275 made
// every list --json page holding it fail. A day inside the years 1..9999 at
// each end keeps every zone's year (UTC-12 to UTC+14) among them.
var (
	minRunAt = time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC)
	maxRunAt = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
)

// timestampYear reports whether t's year is one PostgreSQL's timestamptz holds.
func timestampYear(t time.Time) bool {
	y := t.UTC().Year()
	return y >= minTimestampYear && y <= maxTimestampYear
}

// nameProblem says what is wrong with a queue, machine, step or signal
// name, or "" if nothing is: 1 to maxNameLen bytes of text (textProblem)
// that neither starts nor ends with white space. The dashboard's forms
// pass a name on as typed, as the CLI and the API do; a name " pay" would
// look like "pay" on every page and in every table while a signal "pay"
// never woke its awaiter. For the same reason a name holds none of the
// invisible characters that have no use inside a word (invisible.InName:
// format characters, fillers, variation selectors; not the joiners
// U+200C and U+200D): "pay\u200b" looks like "pay" everywhere. Keys may (a key is the user's
// data).
func nameProblem(s string) string {
	if s == "" {
		return "is empty"
	}
	if p := textProblem(s, maxNameLen); p != "" {
		return p
	}
	if i := invisible.IndexInName(s); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		return fmt.Sprintf("holds the invisible character U+%04X, which makes it look like another name", r)
	}
	return edgeSpaceProblem(s)
}

// quoted is s as an error message names a name, a key or a prefix it
// refuses: quoted (%q), and when s is longer than a name may be, only its
// first 64 bytes (to a character's start) and its length — a 100 KB name
// refused for its length was echoed whole on the operator's terminal (a
// probe).
func quoted(s string) string {
	if len(s) <= maxNameLen {
		return strconv.Quote(s)
	}
	n := 64
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%q… (%d bytes)", s[:n], len(s))
}

// edgeSpaceProblem says whether s starts or ends with white space.
func edgeSpaceProblem(s string) string {
	if p := startSpaceProblem(s); p != "" {
		return p
	}
	if last, _ := utf8.DecodeLastRuneInString(s); unicode.IsSpace(last) {
		return "ends with white space"
	}
	return ""
}

// startSpaceProblem says whether s starts with white space.
func startSpaceProblem(s string) string {
	if first, _ := utf8.DecodeRuneInString(s); unicode.IsSpace(first) {
		return "starts with white space"
	}
	return ""
}

// keyProblem says what is wrong with a partition, unique or dedup key, or
// "" if nothing is: at most maxKeyLen bytes of text (textProblem) that
// neither starts nor ends with white space — "order-7 " and "order-7"
// would be two unique keys that look alike on every page.
func keyProblem(s string) string {
	if p := textProblem(s, maxKeyLen); p != "" {
		return p
	}
	return edgeSpaceProblem(s)
}

// prefixProblem says what is wrong with a KeyPolicy prefix: a key's text
// (textProblem) that does not start with white space, which no key does. It
// may end with one ("acme " for the keys "acme corp-1", "acme corp-2").
func prefixProblem(s string) string {
	if p := textProblem(s, maxKeyLen); p != "" {
		return p
	}
	return startSpaceProblem(s)
}

// searchProblem says what is wrong with a search text (ListFilter.Search):
// at most maxKeyLen bytes of text, neither starting nor ending with white
// space — no instance id or key does, so such a search could only find
// nothing (a bulk action by it would act on nothing, while the same text
// trimmed would not).
func searchProblem(s string) string {
	if p := textProblem(s, maxKeyLen); p != "" {
		return p
	}
	if p := edgeSpaceProblem(s); p != "" {
		return p + " (no id or key does)"
	}
	return ""
}

// textProblem: valid UTF-8 (PostgreSQL text must be), without NUL (it
// cannot hold it) or any other control character (names and keys are
// printed on terminals and pages, and none is typed by a person), nor a
// bidirectional control character (U+061C, U+200E, U+200F, U+202A–U+202E,
// U+2066–U+2069: the Unicode property Bidi_Control), which makes text
// display in another order than it is stored — a partition key
// "acct-1<U+202E>7-tnuocca" shows as "acct-1account-7" on a page and in a
// table, and a name can pass for another.
func textProblem(s string, maxLen int) string {
	switch {
	case len(s) > maxLen:
		return fmt.Sprintf("is longer than %d bytes", maxLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return "holds NUL or another control character"
	case strings.IndexFunc(s, isBidiControl) >= 0:
		return "holds a bidirectional control character (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C), which would show it in another order than it is stored"
	}
	return ""
}

// isBidiControl reports whether r is a Unicode bidirectional control
// character (the Bidi_Control property). The CLI and the dashboard show
// those in other stored text (states, payloads, error messages) as \u
// escapes.
func isBidiControl(r rune) bool { return unicode.Is(unicode.Bidi_Control, r) }

// jsonLimits bounds an encoded JSON document (a state, a result, a signal
// payload) before it reaches the database. PostgreSQL parses jsonb
// recursively and rejects a deep enough document with "stack depth limit
// exceeded"; checking here turns that into the caller's typed error, and an
// outcome that could never be written into one that Handle sees before any
// SQL runs.
type jsonLimits struct {
	maxBytes  int    // 0: no bound
	bytesName string // the Config field that sets maxBytes, for the message
	maxDepth  int    // levels of nested arrays and objects; negative: no bound
}

// checkJSON checks one encoded document against l; what names it in the
// error. It takes the encoding as it comes (a string or bytes): converting
// would copy every state on the hot path. Outcomes check with it; inserts
// and signals with checkInputJSON, which also looks for what jsonb refuses.
func checkJSON[T string | []byte](l jsonLimits, what string, b T) error {
	_, err := scanChecked(l, what, b)
	return err
}

// checkInputJSON is checkJSON for a document an insert or a signal sends,
// followed by jsonbProblem's check, from the same pass over b, and a check
// that b is UTF-8: the errors wrap sentinel (ErrInvalidInsert,
// ErrInvalidSignal). Both come before any
// SQL: the database's refusal would abort the caller's transaction under
// InsertTx or SignalTx.
func checkInputJSON[T string | []byte](l jsonLimits, what string, b T, sentinel error) error {
	s, err := scanChecked(l, what, b)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", sentinel, err)
	case s.jsonb != "":
		return errorf(sentinel, "%s %s", what, s.jsonb)
	case !validUTF8(b):
		// encoding/json replaces invalid UTF-8 in Go strings, but passes
		// a json.RawMessage's or a MarshalJSON's bytes through as they are.
		return errorf(sentinel, "%s is not valid UTF-8 (a json.RawMessage or a MarshalJSON result), which PostgreSQL refuses", what)
	}
	return nil
}

// validUTF8 is utf8.Valid for either form of an encoding, without copying.
func validUTF8[T string | []byte](b T) bool {
	switch v := any(b).(type) {
	case string:
		return utf8.ValidString(v)
	case []byte:
		return utf8.Valid(v)
	}
	return false
}

// scanChecked scans b (scanJSON) and turns what it found into checkJSON's
// error, in this order: the encoded size, the nesting, a number numeric
// cannot hold, the size with numbers as PostgreSQL writes them back.
func scanChecked[T string | []byte](l jsonLimits, what string, b T) (jsonScan, error) {
	if l.maxBytes > 0 && len(b) > l.maxBytes {
		return jsonScan{}, fmt.Errorf("%s is %d bytes encoded, over Config.%s %d", what, len(b), l.bytesName, l.maxBytes)
	}
	s := scanJSON(b, l.maxDepth)
	switch {
	case s.deeper:
		return s, fmt.Errorf("%s nests arrays and objects deeper than Config.MaxJSONDepth %d", what, l.maxDepth)
	case s.number != "":
		return s, fmt.Errorf("%s holds %s", what, s.number)
	case l.maxBytes > 0 && len(b)+s.grown > l.maxBytes:
		return s, fmt.Errorf("%s is %d bytes with its numbers as PostgreSQL writes them back (an exponent written out in full: 1e6 as 1000000), over Config.%s %d",
			what, len(b)+s.grown, l.bytesName, l.maxBytes)
	}
	return s, nil
}

// PostgreSQL's numeric, which jsonb stores numbers as, holds at most this
// many digits before the decimal point and after it.
const (
	numericMaxIntDigits  = 131072
	numericMaxFracDigits = 16383
	// numericMaxExponent: numeric_in refuses an exponent this large or
	// larger, either sign, before it looks at the digits (INT_MAX / 2).
	numericMaxExponent = 1073741823
)

// jsonScan is what scanJSON finds in a document.
type jsonScan struct {
	// deeper: arrays and objects nest deeper than the limit. The scan
	// stops there, leaving the fields below unfinished.
	deeper bool
	// grown: how many bytes longer than encoded the numbers are as
	// PostgreSQL's jsonb stores them, as numeric, and writes them out when
	// the document is read (1e6 comes back as 1000000, 1e-6 as 0.000001).
	// Left unchecked, a state of 90 KB holding 10,000 numbers 1e131071
	// reads back as 1.3 GB: every read of it, the pick of its queue
	// included, failed with "out of memory", and no other instance of the
	// queue ran. Not counted on past a number problem.
	grown int
	// number: the first number numeric cannot hold at all (its refusal
	// would abort the caller's transaction), or "".
	number string
	// jsonb: why PostgreSQL would refuse the document as jsonb, or "": a
	// \u0000 escape (jsonb cannot hold NUL; encoding/json writes one for a
	// NUL byte in a Go string), or a \u escape of a UTF-16 surrogate that
	// is not a high one followed by a low one. The first such escape; past
	// a malformed \u escape (not valid JSON: json.Valid's verdict, not
	// ours) none is looked for.
	jsonb string
}

// jsonbNUL, jsonbLowSurrogate, jsonbHighSurrogate: jsonScan.jsonb's
// problems.
const (
	jsonbNUL           = "holds a NUL character (\\u0000), which PostgreSQL cannot store"
	jsonbLowSurrogate  = "holds a lone UTF-16 low surrogate escape, which PostgreSQL refuses"
	jsonbHighSurrogate = "holds a UTF-16 high surrogate escape without its low surrogate, which PostgreSQL refuses"
)

// scanJSON reads the valid JSON document b once, for how deeply it nests
// arrays and objects (against limit; negative: no limit), how PostgreSQL
// stores its numbers, and what jsonb refuses in its strings (jsonScan).
// Every document an insert, a signal or an outcome sends passes through
// it, so it reads each byte once: a document of at most limit bytes cannot
// nest deeper than limit, and the common small state skips the count.
//
// It assumes valid JSON (callers pass encoding/json's output, or text
// json.Valid accepted) and does not check it: on other input it neither
// panics nor claims anything useful.
func scanJSON[T string | []byte](b T, limit int) (s jsonScan) {
	if len(b) <= limit {
		limit = -1
	}
	depth := 0
	jsonbOpen := true // still looking for a jsonb problem
	for i := 0; i < len(b); i++ {
		switch jsonByteKind[b[i]] {
		case 0:
		case kindQuote:
			// A string, to its closing quote; the byte after a backslash
			// is escaped.
		str:
			for i++; i < len(b); i++ {
				switch b[i] {
				case '"':
					break str
				case '\\':
				default:
					continue
				}
				if i+1 < len(b) && b[i+1] != 'u' {
					i++ // \" \\ \/ \b \f \n \r \t
					continue
				}
				if !jsonbOpen {
					i++
					continue
				}
				r, ok := hex4(b, i+2)
				switch {
				case !ok:
					jsonbOpen = false
					i++
					continue
				case r == 0:
					s.jsonb, jsonbOpen = jsonbNUL, false
				case r >= 0xdc00 && r <= 0xdfff:
					s.jsonb, jsonbOpen = jsonbLowSurrogate, false
				case r >= 0xd800 && r <= 0xdbff:
					if lo, ok := hex4(b, i+8); !ok || b[i+6] != '\\' || b[i+7] != 'u' || lo < 0xdc00 || lo > 0xdfff {
						s.jsonb, jsonbOpen = jsonbHighSurrogate, false
						break
					}
					i += 6 // the pair's first half; its second below
				}
				i += 5 // the escape's u and 4 hex digits, none a quote
			}
		case kindOpen:
			if depth++; limit >= 0 && depth > limit {
				s.deeper = true
				return s
			}
		case kindClose:
			depth--
		case kindNumber:
			// Most numbers have no exponent and are stored as sent: read
			// past their digits here, and leave the rest to storedNumber.
			start := i
			if b[i] == '-' {
				i++
			}
			for i < len(b) && (b[i] >= '0' && b[i] <= '9' || b[i] == '.') {
				i++
			}
			if (i >= len(b) || (b[i] != 'e' && b[i] != 'E')) && i-start <= numericMaxFracDigits {
				i-- // the number's last byte
				continue
			}
			// An exponent, or digits enough to be more than numeric holds.
			var grown int
			var problem string
			i, grown, problem = storedNumber(b, start)
			if s.number == "" {
				s.number = problem
				s.grown += grown
			}
		}
	}
	return s
}

// jsonByteKind: the bytes scanJSON looks at outside strings.
var jsonByteKind = [256]uint8{'"': kindQuote, '[': kindOpen, '{': kindOpen, ']': kindClose, '}': kindClose,
	'-': kindNumber, '0': kindNumber, '1': kindNumber, '2': kindNumber, '3': kindNumber, '4': kindNumber,
	'5': kindNumber, '6': kindNumber, '7': kindNumber, '8': kindNumber, '9': kindNumber}

const (
	kindQuote = 1 + iota
	kindOpen
	kindClose
	kindNumber
)

// storedNumber reads the number of b that starts at start (-?int(.frac)?
// ([eE][+-]?exp)?) as PostgreSQL's jsonb stores it: as numeric, written out
// in full. It returns the index of its last byte, how many bytes longer
// than encoded it is then, or a problem: a number numeric cannot hold.
func storedNumber[T string | []byte](b T, start int) (last, grown int, problem string) {
	i := start
	neg := b[i] == '-'
	if neg {
		i++
	}
	intStart := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	intDigits := i - intStart
	fracStart, fracDigits := i, 0
	if i < len(b) && b[i] == '.' {
		i++
		fracStart = i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		fracDigits = i - fracStart
	}
	if i >= len(b) || (b[i] != 'e' && b[i] != 'E') {
		// No exponent: written back as it came, if numeric holds it (JSON
		// has no leading zeros but a lone "0").
		if intDigits > numericMaxIntDigits || fracDigits > numericMaxFracDigits {
			return i - 1, 0, unstorable(string(b[start:i]))
		}
		return i - 1, 0, ""
	}
	i++
	expNeg := false
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		expNeg = b[i] == '-'
		i++
	}
	exp := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if exp < 1<<30 {
			exp = exp*10 + int(b[i]-'0')
		}
	}
	encoded := i - start
	if exp >= numericMaxExponent {
		// Refused whatever the digits, zero too (0e1073741823: a probe's
		// got past, and the database's refusal aborted an InsertTx
		// caller's transaction).
		return i - 1, 0, fmt.Sprintf("a number PostgreSQL cannot store (%s: numeric takes an exponent of at most %d either way)",
			clip(string(b[start:i]), 40), numericMaxExponent-1)
	}
	if expNeg {
		exp = -exp
	}
	// The significant digits: those of int and frac, leading zeros
	// skipped; the decimal point falls intDigits+exp digits in.
	zeros, all := 0, intDigits+fracDigits
	for k := 0; k < all; k++ {
		d := b[intStart+k]
		if k >= intDigits {
			d = b[fracStart+k-intDigits]
		}
		if d != '0' {
			break
		}
		zeros++
	}
	before := 1 // "0"
	if zeros < all && intDigits+exp-zeros > 0 {
		before = intDigits + exp - zeros
	}
	after := max(0, fracDigits-exp)
	if (zeros < all && intDigits+exp-zeros > numericMaxIntDigits) || after > numericMaxFracDigits {
		return i - 1, 0, unstorable(string(b[start:i]))
	}
	stored := before
	if after > 0 {
		stored += 1 + after
	}
	if neg {
		stored++
	}
	return i - 1, max(0, stored-encoded), ""
}

// unstorable is storedNumber's problem for a number num that numeric
// cannot hold.
func unstorable(num string) string {
	return fmt.Sprintf("a number PostgreSQL cannot store (%s: numeric holds %d digits before the decimal point and %d after)",
		clip(num, 40), numericMaxIntDigits, numericMaxFracDigits)
}

// jsonbProblem says why PostgreSQL would refuse the valid JSON document b
// as jsonb, or "" if it would not (jsonScan.jsonb).
func jsonbProblem[T string | []byte](b T) string { return scanJSON(b, -1).jsonb }

// clip cuts s to at most n bytes, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// hex4 reads 4 hex digits of b at i.
func hex4[T string | []byte](b T, i int) (rune, bool) {
	if i < 0 || i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(b[i : i+4]) {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
