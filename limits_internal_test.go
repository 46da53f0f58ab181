package gendurable

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// nestsDeeper and storedNumbers read scanJSON's findings as the functions
// of those names did before scanJSON replaced them (their code, the
// oracle, is below as oldNestsDeeper and oldStoredNumbers).
func nestsDeeper[T string | []byte](b T, limit int) bool { return scanJSON(b, limit).deeper }

func storedNumbers[T string | []byte](b T) (grown int, problem string) {
	s := scanJSON(b, -1)
	if s.number != "" {
		return 0, s.number
	}
	return s.grown, ""
}

func TestNestsDeeper(t *testing.T) {
	t.Parallel()
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	cases := []struct {
		doc   string
		limit int
		want  bool
	}{
		{deep(3), 3, false},
		{deep(4), 3, true},
		{`{"a":{"b":[1]}}`, 3, false},
		{`{"a":{"b":[[1]]}}`, 3, true},
		{`["[[[[", "\"[[[[", "\\", [1]]`, 2, false}, // brackets and escapes inside strings do not nest
		{`["\\\"", [[1]]]`, 2, true},
		{deep(50), -1, false}, // no limit
	}
	for _, c := range cases {
		if got := nestsDeeper(c.doc, c.limit); got != c.want {
			t.Errorf("nestsDeeper(%s, %d) = %v, want %v", c.doc, c.limit, got, c.want)
		}
		if got := nestsDeeper([]byte(c.doc), c.limit); got != c.want {
			t.Errorf("nestsDeeper([]byte(%s), %d) = %v, want %v", c.doc, c.limit, got, c.want)
		}
	}
}

func TestJSONBProblem(t *testing.T) {
	t.Parallel()
	for doc, bad := range map[string]bool{
		`{"a":"x"}`:                  false,
		`"\u0000"`:                   true,
		`{"k\u0000":1}`:              true,  // in a key too
		`"\\u0000"`:                  false, // an escaped backslash, then text
		`"\\\u0000"`:                 true,
		`"\u00001"`:                  true,
		`"\u0001\u001f\u00e9"`:       false,
		`"\ud83d\ude00"`:             false, // a pair
		`"\uD83D\uDE00"`:             false,
		`"\ud800"`:                   true,
		`"\ud800x"`:                  true,
		`"\ud800\u0041"`:             true,
		`"\ud800\ud800"`:             true,
		`"\udc00"`:                   true,
		`"\ude00\ud83d"`:             true,
		`["\ud83d\ude00", "\u0000"]`: true,
		`"\"\\\/\b\f\n\r\t"`:         false,
	} {
		if got := jsonbProblem(doc) != ""; got != bad {
			t.Errorf("jsonbProblem(%s) = %q, want a problem: %v", doc, jsonbProblem(doc), bad)
		}
		if got := jsonbProblem([]byte(doc)) != ""; got != bad {
			t.Errorf("jsonbProblem([]byte(%s)) = %q, want a problem: %v", doc, jsonbProblem([]byte(doc)), bad)
		}
	}
}

// TestStoredNumbers: the lengths PostgreSQL 15 writes these numbers back
// with (SELECT length(('N'::jsonb)::text)), and the ones it refuses
// ("value overflows numeric format").
func TestStoredNumbers(t *testing.T) {
	t.Parallel()
	for num, stored := range map[string]int{
		"0e-16383":               16385,
		"0.5e-16382":             16385,
		"10e131070":              131072,
		"0.1e131072":             131072,
		"0.01e131073":            131072,
		"1E2":                    3,
		"1e+2":                   3,
		"12.345e1":               6,
		"0.0001e5":               2,
		"1e1000":                 1001,
		"5e-324":                 326,
		"1.7976931348623157e308": 309,
		"-1e3":                   5,
		"1.50":                   4,
		"123456":                 6,
		"1e131071":               131072,
		"1e-16383":               16385,
		// Refused by PostgreSQL: -1.
		"0e-20000":              -1,
		"0.5e-16383":            -1,
		"1e131072":              -1,
		"-1e131072":             -1,
		"123456789e131064":      -1,
		"0.0000001e-16380":      -1,
		"1E+131072":             -1,
		"1e-16384":              -1,
		"1e999999999999999999":  -1,
		"1e-999999999999999999": -1,
		// A zero's exponent (a probe: 0e1073741823 was taken as "0").
		"0e1073741822":     1,
		"0.000e1073741822": 1,
		"0e1073741823":     -1,
		"-0e1073741823":    -1,
		"0e99999999999":    -1,
		"0E+1073741823":    -1,
		// Without an exponent (an API probe: these were not counted, and
		// the database refused them in the caller's transaction).
		strings.Repeat("9", 131072):        131072,
		"-" + strings.Repeat("9", 131072):  131073,
		"0." + strings.Repeat("1", 16383):  16385,
		strings.Repeat("9", 131073):        -1,
		"0." + strings.Repeat("1", 16384):  -1,
		"-1." + strings.Repeat("0", 16384): -1,
		strings.Repeat("9", 20000) + ".5":  20002,
	} {
		for _, doc := range []string{num, `{"a":[` + num + `],"b":"1e9999999 \"1e9999999"}`} {
			grown, problem := storedNumbers(doc)
			switch {
			case stored < 0 && problem == "":
				t.Errorf("storedNumbers(%s): no problem, want PostgreSQL's refusal", doc)
			case stored >= 0 && problem != "":
				t.Errorf("storedNumbers(%s): %s, want %d bytes", doc, problem, stored)
			case stored >= 0 && len(num)+grown != max(stored, len(num)):
				t.Errorf("storedNumbers(%s): %d bytes stored, want %d", doc, len(num)+grown, stored)
			}
			if g, p := storedNumbers([]byte(doc)); g != grown || p != problem {
				t.Errorf("storedNumbers([]byte(%s)) = %d, %q; as a string %d, %q", doc, g, p, grown, problem)
			}
		}
	}
	// A numbers bomb is over the byte limit as stored, not as sent.
	l := jsonLimits{maxBytes: 1 << 20, bytesName: "MaxStateBytes", maxDepth: 1000}
	bomb := "[" + strings.TrimSuffix(strings.Repeat("1e131071,", 8), ",") + "]"
	if err := checkJSON(l, "state", bomb); err == nil || !strings.Contains(err.Error(), "as PostgreSQL writes them back") {
		t.Errorf("checkJSON(8 × 1e131071) = %v, want over MaxStateBytes as stored", err)
	}
	if err := checkJSON(l, "state", "[1e131071, 1.7976931348623157e308, 5e-324]"); err != nil {
		t.Errorf("checkJSON of large but storable numbers: %v", err)
	}
}

// The oracle: the three passes that checkJSON and the insert and signal
// paths made before scanJSON (limits.go at 8f720c0), kept verbatim but for
// their names. TestCheckJSONMatchesThreePasses and FuzzCheckJSON hold the
// one pass to them.

// oldCheckInputJSON is what Insert and Signal did: checkJSON, then
// jsonbProblem.
func oldCheckInputJSON[T string | []byte](l jsonLimits, what string, b T, sentinel error) error {
	if err := oldCheckJSON(l, what, b); err != nil {
		return fmt.Errorf("%w: %w", sentinel, err)
	}
	if p := oldJSONBProblem(b); p != "" {
		return errorf(sentinel, "%s %s", what, p)
	}
	if !utf8.Valid([]byte(b)) {
		return errorf(sentinel, "%s is not valid UTF-8 (a json.RawMessage or a MarshalJSON result), which PostgreSQL refuses", what)
	}
	return nil
}

// oldCheckJSON checks one encoded document against l; what names it in the
// error. It takes the encoding as it comes (a string or bytes): converting
// would copy every state on the hot path.
func oldCheckJSON[T string | []byte](l jsonLimits, what string, b T) error {
	if l.maxBytes > 0 && len(b) > l.maxBytes {
		return fmt.Errorf("%s is %d bytes encoded, over Config.%s %d", what, len(b), l.bytesName, l.maxBytes)
	}
	if oldNestsDeeper(b, l.maxDepth) {
		return fmt.Errorf("%s nests arrays and objects deeper than Config.MaxJSONDepth %d", what, l.maxDepth)
	}
	grown, problem := oldStoredNumbers(b)
	switch {
	case problem != "":
		return fmt.Errorf("%s holds %s", what, problem)
	case l.maxBytes > 0 && len(b)+grown > l.maxBytes:
		return fmt.Errorf("%s is %d bytes with its numbers as PostgreSQL writes them back (an exponent written out in full: 1e6 as 1000000), over Config.%s %d",
			what, len(b)+grown, l.bytesName, l.maxBytes)
	}
	return nil
}

// oldStoredNumbers reads the numbers of the valid JSON document b as
// PostgreSQL's jsonb stores them: as numeric, written out in full when the
// document is read (1e6 comes back as 1000000, 1e-6 as 0.000001). It
// returns how many bytes longer than in b they are then, or a problem: a
// number numeric cannot hold at all (its refusal would abort the caller's
// transaction). Left unchecked, a state of 90 KB holding 10,000 numbers
// 1e131071 reads back as 1.3 GB: every read of it, the pick of its queue
// included, failed with "out of memory", and no other instance of the
// queue ran.
func oldStoredNumbers[T string | []byte](b T) (grown int, problem string) {
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == '"':
			i = oldStringEnd(b, i)
			continue
		case c != '-' && (c < '0' || c > '9'):
			continue
		}
		// A number: -?int(.frac)?([eE][+-]?exp)?
		start := i
		neg := c == '-'
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
			// No exponent: written back as it came. (The loop's i++
			// moves past the number.)
			i--
			continue
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
		i--
		if exp >= numericMaxExponent { // added with storedNumber's check (a probe's 0e1073741823)
			return 0, fmt.Sprintf("a number PostgreSQL cannot store (%s: numeric takes an exponent of at most %d either way)",
				clip(string(b[start:i+1]), 40), numericMaxExponent-1)
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
			return 0, fmt.Sprintf("a number PostgreSQL cannot store (%s: numeric holds %d digits before the decimal point and %d after)",
				clip(string(b[start:i+1]), 40), numericMaxIntDigits, numericMaxFracDigits)
		}
		stored := before
		if after > 0 {
			stored += 1 + after
		}
		if neg {
			stored++
		}
		grown += max(0, stored-encoded)
	}
	return grown, ""
}

// oldStringEnd returns the index of the quote that closes the JSON string
// whose opening quote is b[i] (len(b) if none does), skipping escapes.
func oldStringEnd[T string | []byte](b T, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++ // the escaped byte
		case '"':
			return i
		}
	}
	return len(b)
}

// oldNestsDeeper reports whether b (valid JSON) nests arrays and objects
// deeper than limit (negative: no limit). A document of at most limit bytes
// cannot nest that deep, so the common small state costs a length
// comparison.
func oldNestsDeeper[T string | []byte](b T, limit int) bool {
	if limit < 0 || len(b) <= limit {
		return false
	}
	depth := 0
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			i = oldStringEnd(b, i)
		case c == '[' || c == '{':
			if depth++; depth > limit {
				return true
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return false
}

// oldJSONBProblem says why PostgreSQL would refuse the valid JSON document b
// as jsonb, or "" if it would not: a \u0000 escape (jsonb cannot hold NUL;
// encoding/json writes one for a NUL byte in a Go string), or a \u escape
// of a UTF-16 surrogate that is not a high one followed by a low one.
// Inserts and signals check it before any SQL: the database's refusal
// would abort the caller's transaction under InsertTx or SignalTx.
func oldJSONBProblem[T string | []byte](b T) string {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' { // in valid JSON, only inside a string
			continue
		}
		if i+1 < len(b) && b[i+1] != 'u' {
			i++ // \" \\ \/ \b \f \n \r \t
			continue
		}
		r, ok := oldHex4(b, i+2)
		switch {
		case !ok:
			return "" // not valid JSON: json.Valid's verdict, not ours
		case r == 0:
			return "holds a NUL character (\\u0000), which PostgreSQL cannot store"
		case r >= 0xdc00 && r <= 0xdfff:
			return "holds a lone UTF-16 low surrogate escape, which PostgreSQL refuses"
		case r >= 0xd800 && r <= 0xdbff:
			if lo, ok := oldHex4(b, i+8); !ok || i+7 >= len(b) || b[i+6] != '\\' || b[i+7] != 'u' || lo < 0xdc00 || lo > 0xdfff {
				return "holds a UTF-16 high surrogate escape without its low surrogate, which PostgreSQL refuses"
			}
			i += 11 // the pair
			continue
		}
		i += 5
	}
	return ""
}

// oldHex4 reads 4 hex digits of b at i.
func oldHex4[T string | []byte](b T, i int) (rune, bool) {
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

// diffLimits: the limits the one pass and the oracle are compared under —
// byte bounds that cut documents before and after their numbers grow, and
// depth bounds that the small documents of the generator reach.
var diffLimits = func() []jsonLimits {
	var ls []jsonLimits
	for _, maxBytes := range []int{0, 16, 200, 5000, 1 << 20} {
		for _, maxDepth := range []int{-1, 0, 1, 2, 3, 7, 1000} {
			ls = append(ls, jsonLimits{maxBytes: maxBytes, bytesName: "MaxStateBytes", maxDepth: maxDepth})
		}
	}
	return ls
}()

// diffJSON fails t unless the one pass and the oracle find the same in doc:
// checkInputJSON's and checkJSON's errors (text, sentinel, type) under
// every diffLimits, and each old pass's own verdict. Only valid JSON is
// compared (scanJSON's contract); other input must not panic.
func diffJSON(t *testing.T, doc []byte) {
	t.Helper()
	if !json.Valid(doc) {
		for _, l := range diffLimits {
			_ = checkInputJSON(l, "state", doc, ErrInvalidInsert)
			_ = checkInputJSON(l, "state", string(doc), ErrInvalidInsert)
		}
		return
	}
	same := func(kind string, l jsonLimits, got, want error) {
		t.Helper()
		switch {
		case (got == nil) != (want == nil):
			t.Fatalf("%s(%+v, %q) = %v, the three passes %v", kind, l, clip(string(doc), 200), got, want)
		case got == nil:
		case got.Error() != want.Error() || fmt.Sprintf("%T", got) != fmt.Sprintf("%T", want) ||
			errors.Is(got, ErrInvalidInsert) != errors.Is(want, ErrInvalidInsert) || errors.Unwrap(got) != errors.Unwrap(want):
			t.Fatalf("%s(%+v, %q) = %T %v, the three passes %T %v", kind, l, clip(string(doc), 200), got, got, want, want)
		}
	}
	for _, l := range diffLimits {
		same("checkInputJSON", l, checkInputJSON(l, "state", doc, ErrInvalidInsert), oldCheckInputJSON(l, "state", doc, ErrInvalidInsert))
		same("checkInputJSON string", l, checkInputJSON(l, "state", string(doc), ErrInvalidInsert), oldCheckInputJSON(l, "state", string(doc), ErrInvalidInsert))
		same("checkJSON", l, checkJSON(l, "payload", doc), oldCheckJSON(l, "payload", doc))
	}
	for _, limit := range []int{-1, 0, 1, 2, 3, 5, 10, 50} {
		if got, want := nestsDeeper(doc, limit), oldNestsDeeper(doc, limit); got != want {
			t.Fatalf("nestsDeeper(%q, %d) = %v, the old pass %v", clip(string(doc), 200), limit, got, want)
		}
	}
	if got, want := jsonbProblem(doc), oldJSONBProblem(doc); got != want {
		t.Fatalf("jsonbProblem(%q) = %q, the old pass %q", clip(string(doc), 200), got, want)
	}
	g, p := storedNumbers(doc)
	if og, op := oldStoredNumbers(doc); g != og || p != op {
		t.Fatalf("storedNumbers(%q) = %d, %q; the old pass %d, %q", clip(string(doc), 200), g, p, og, op)
	}
}

// genJSON builds a valid JSON document from the bytes of src (a fuzzer's
// or a random source's), aiming at what the checks look at: nesting,
// numbers with and without exponents, escapes (\u0000, surrogate pairs,
// lone and reversed surrogates, escaped quotes and backslashes), and
// brackets and digits inside strings.
func genJSON(src []byte) []byte {
	var b bytes.Buffer
	next := func() byte {
		if len(src) == 0 {
			return 0
		}
		c := src[0]
		src = src[1:]
		return c
	}
	numbers := []string{"0", "-0", "1", "-1", "12.5", "0.000", "1e6", "1E+6", "1e-6", "-2.5e-3", "0e-16383", "0e-20000",
		"1e131071", "1e131072", "10e131070", "0.1e131072", "1e-16383", "1e-16384", "0.5e-16383", "1.7976931348623157e308",
		"5e-324", "1e999999999999999999", "-1e-999999999999999999", "0e1073741822", "0e1073741823", "123456789e131064", "0.0001e5", "1.50", "100"}
	pieces := []string{"a", "Z", " ", "é", "😀", `\"`, `\\`, `\/`, `\n`, `\t`, `\u0000`, `\u0041`, `\u00e9`, `\ud83d\ude00`,
		`\uD83D\uDE00`, `\ud800`, `\udc00`, `\ude00\ud83d`, `\ud800\u0041`, `\ud800\ud800`, `\uDBFF\uDFFF`, "[", "{", "]", "}",
		"1e999999", "-", `\\u0000`, `\\\u0000`, ","}
	var value func(depth int)
	str := func() {
		b.WriteByte('"')
		for n := int(next() % 6); n > 0; n-- {
			b.WriteString(pieces[int(next())%len(pieces)])
		}
		b.WriteByte('"')
	}
	value = func(depth int) {
		if next()%4 == 0 {
			b.WriteString(" \n\t\r"[next()%4 : 4])
		}
		op := next() % 8
		if depth > 60 && op >= 5 {
			op %= 5
		}
		switch op {
		case 0, 1:
			if next()%3 == 0 {
				// A number of its own making: sign, digits, fraction, exponent.
				if next()%2 == 0 {
					b.WriteByte('-')
				}
				if next()%3 == 0 {
					b.WriteByte('0')
				} else {
					b.WriteByte('1' + next()%9)
					for n := next() % 6; n > 0; n-- {
						b.WriteByte('0' + next()%10)
					}
				}
				if next()%2 == 0 {
					b.WriteByte('.')
					for n := 1 + next()%6; n > 0; n-- {
						b.WriteByte('0' + next()%10)
					}
				}
				if next()%2 == 0 {
					b.WriteString([]string{"e", "E", "e+", "e-", "E-"}[next()%5])
					for n := 1 + next()%7; n > 0; n-- {
						b.WriteByte('0' + next()%10)
					}
				}
			} else {
				b.WriteString(numbers[int(next())%len(numbers)])
			}
		case 2, 3:
			str()
		case 4:
			b.WriteString([]string{"true", "false", "null"}[next()%3])
		case 5, 6:
			b.WriteByte('[')
			for n := next() % 5; n > 0; n-- {
				value(depth + 1)
				if n > 1 {
					b.WriteByte(',')
				}
			}
			b.WriteByte(']')
		case 7:
			b.WriteByte('{')
			for n := next() % 4; n > 0; n-- {
				str()
				b.WriteByte(':')
				value(depth + 1)
				if n > 1 {
					b.WriteByte(',')
				}
			}
			b.WriteByte('}')
		}
	}
	value(0)
	return b.Bytes()
}

// corpusDocs: the JSON documents of FuzzInsertInput's and FuzzSignalInput's
// seed corpora (their []byte arguments).
func corpusDocs(t testing.TB) [][]byte {
	var docs [][]byte
	for _, dir := range []string{"FuzzInsertInput", "FuzzSignalInput"} {
		files, err := filepath.Glob(filepath.Join("testdata", "fuzz", dir, "*"))
		if err != nil || len(files) == 0 {
			t.Fatalf("corpus %s: %v (%d files)", dir, err, len(files))
		}
		for _, f := range files {
			text, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(text), "\n") {
				if q, ok := strings.CutPrefix(line, "[]byte("); ok {
					doc, err := strconv.Unquote(strings.TrimSuffix(q, ")"))
					if err != nil {
						t.Fatalf("%s: %v", f, err)
					}
					docs = append(docs, []byte(doc))
				}
			}
		}
	}
	return docs
}

// fixedDocs: the documents of the tests above, the seeds of the fuzz
// targets, and some edges (empty, a high surrogate at the end).
func fixedDocs() [][]byte {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	docs := []string{`{"a":1}`, `{"a":"\u0000"}`, `null`, `{}`, `"` + strings.Repeat("x", 70000) + `"`, `{"cents":42}`, `1`,
		`"` + strings.Repeat("x", 2000) + `"`, deep(600), deep(9000), deep(3), deep(4), `{"a":{"b":[1]}}`, `{"a":{"b":[[1]]}}`,
		`["[[[[", "\"[[[[", "\\", [1]]`, `["\\\"", [[1]]]`, `"\ud800"`, `"\ud800\u"`, `"\ud83d\ude00"`, `["\ud83d\ude00", "\u0000"]`,
		`"\"\\\/\b\f\n\r\t"`, `"\\\u0000"`, `"\\u0000"`, `[1e131071, 1.7976931348623157e308, 5e-324]`, `-`, ``, `"\`,
		`[1e131072, [[[[[[[[1]]]]]]]], "\u0000"]`, `["\u0000", 1e131072]`, `[1e131072, "\u0000", 1e999999]`,
		"[" + strings.TrimSuffix(strings.Repeat("1e131071,", 8), ",") + "]", `{"a":[1e5],"b":"1e9999999 \"1e9999999"}`}
	var out [][]byte
	for _, d := range docs {
		out = append(out, []byte(d))
	}
	return out
}

// TestCheckJSONMatchesThreePasses holds scanJSON's one pass to the three
// passes it replaced, over the fuzz corpora and 20,000 generated documents.
func TestCheckJSONMatchesThreePasses(t *testing.T) {
	t.Parallel()
	for _, doc := range append(corpusDocs(t), fixedDocs()...) {
		diffJSON(t, doc)
	}
	r := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 512)
	for range 20000 {
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		diffJSON(t, genJSON(src))
	}
}

// FuzzCheckJSON: the one pass against the three, over the fuzzer's bytes
// taken as a document (mostly not valid JSON: then only no panic) and as
// the recipe of a valid one (genJSON).
func FuzzCheckJSON(f *testing.F) {
	for _, doc := range append(corpusDocs(f), fixedDocs()...) {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		diffJSON(t, b)
		diffJSON(t, genJSON(b))
	})
}

// benchDoc is a state of n bytes (n >= 160): an order with line items,
// strings with escapes, numbers with and without exponents, and a padding
// string that makes up the size.
func benchDoc(n int) string {
	type item struct {
		SKU   string  `json:"sku"`
		Qty   int     `json:"qty"`
		Price float64 `json:"price"`
		Note  string  `json:"note"`
	}
	doc := struct {
		ID       int64   `json:"id"`
		Customer string  `json:"customer"`
		Total    float64 `json:"total"`
		Items    []item  `json:"items"`
		Pad      string  `json:"pad"`
	}{ID: 1234567, Customer: "c-7 \"Ünïcode\" <x>", Total: 1.5e-7}
	encode := func() []byte {
		b, err := json.Marshal(doc)
		if err != nil {
			panic(err)
		}
		return b
	}
	for k := 0; ; k++ {
		doc.Items = append(doc.Items, item{SKU: fmt.Sprintf("sku-%d", k), Qty: k % 7, Price: float64(k) * 1.25e3, Note: "tab\there\n"})
		if len(encode()) > n {
			doc.Items = doc.Items[:len(doc.Items)-1]
			break
		}
	}
	doc.Pad = strings.Repeat("x", n-len(encode()))
	if b := encode(); len(b) != n {
		panic(fmt.Sprintf("benchDoc(%d) is %d bytes", n, len(b)))
	}
	return string(encode())
}

// BenchmarkCheckJSON: an insert's check of its state, the three passes
// before (checkJSON, then jsonbProblem) against the one.
func BenchmarkCheckJSON(b *testing.B) {
	l := jsonLimits{maxBytes: 4 << 20, bytesName: "MaxStateBytes", maxDepth: DefaultMaxJSONDepth}
	for _, size := range []struct {
		name string
		n    int
	}{{"256B", 256}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}} {
		doc := benchDoc(size.n)
		for _, impl := range []struct {
			name  string
			check func(jsonLimits, string, string, error) error
		}{{"old", oldCheckInputJSON[string]}, {"new", checkInputJSON[string]}} {
			b.Run(impl.name+"/"+size.name, func(b *testing.B) {
				b.SetBytes(int64(len(doc)))
				b.ReportAllocs()
				for b.Loop() {
					if err := impl.check(l, "state", doc, ErrInvalidInsert); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestQuoted: a refused name is quoted whole up to a name's length, and
// beyond it cut to 64 bytes on a character's start, with its length (a
// probe: pause, resume and list --machine echoed a 100 KB name whole).
func TestQuoted(t *testing.T) {
	require.Equal(t, `"pay"`, quoted("pay"))
	long := strings.Repeat("é", 60_000) // 2 bytes each: byte 64 starts a character
	require.Equal(t, `"`+strings.Repeat("é", 32)+`"… (120000 bytes)`, quoted(long))
	odd := "x" + long // byte 64 is inside a character: cut before it
	require.Equal(t, `"x`+strings.Repeat("é", 31)+`"… (120001 bytes)`, quoted(odd))
	err := checkName("queue", strings.Repeat("q", 100_000))
	require.ErrorIs(t, err, ErrInvalidInput)
	require.Less(t, len(err.Error()), 200, err.Error())
	require.Contains(t, err.Error(), "(100000 bytes) is longer than 200 bytes")
}
