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
