package gendurable

import (
	"strings"
	"testing"
)

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
	if err := checkJSON(l, "state", bomb); err == nil || !strings.Contains(err.Error(), "as PostgreSQL stores") {
		t.Errorf("checkJSON(8 × 1e131071) = %v, want over MaxStateBytes as stored", err)
	}
	if err := checkJSON(l, "state", "[1e131071, 1.7976931348623157e308, 5e-324]"); err != nil {
		t.Errorf("checkJSON of large but storable numbers: %v", err)
	}
}
