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
