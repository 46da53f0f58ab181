package sqlq

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestOutcomeSQLUsesTheKindConstants: the outcome statement's CASEs are
// written with the Kind constants, never with bare numbers, so a kind added
// or renumbered in Go cannot silently disagree with the SQL.
func TestOutcomeSQLUsesTheKindConstants(t *testing.T) {
	t.Parallel()
	kinds := []Kind{KindNext, KindReplay, KindDone, KindStop, KindAwait, KindChildren}
	names := map[string]bool{}
	for i, k := range kinds {
		if int(k) != i+1 {
			t.Fatalf("%s = %d: the kind column's values are 1..6 in this order", k, k)
		}
		if names[k.String()] || k.String() == "none" {
			t.Fatalf("kind %d has no name of its own: %q", k, k.String())
		}
		names[k.String()] = true
	}
	if KindNone.String() != "none" {
		t.Fatalf("KindNone is %q", KindNone)
	}
	// In the template, every comparison with o.kind names a kind.
	bare := regexp.MustCompile(`o\.kind\s*(=|IN \()\s*\d|WHEN \d+ THEN`)
	for shape := range outcomeShape(shapeCount) {
		raw := outcomeSQLTemplate(shape)
		if m := bare.FindString(raw); m != "" {
			t.Fatalf("shape %d: bare kind number in the outcome template: %q", shape, m)
		}
		rendered := render(outcomeSQL(shape), quoteIdent("s"))
		if strings.Contains(rendered, "{{") {
			t.Fatalf("shape %d: unrendered placeholder left: %s", shape, rendered[strings.Index(rendered, "{{"):][:20])
		}
		if !strings.Contains(rendered, "WHEN "+strconv.Itoa(int(KindAwait))+" THEN") {
			t.Fatalf("shape %d: the await kind's value is not in the statement", shape)
		}
	}
}

// BenchmarkOutcomeBatch measures adding outcomes to a reused batch (the
// group committer's per-outcome cost before the statement).
func BenchmarkOutcomeBatch(b *testing.B) {
	step, state := "b", `{"order":"A-1","items":["book"],"paid":1}`
	o := Outcome{ID: 1, Token: 2, Kind: KindNext, Step: &step, State: &state, Continue: true}
	var batch OutcomeBatch
	b.ReportAllocs()
	for b.Loop() {
		batch.Reset()
		for range 100 {
			batch.Add(&o)
		}
	}
}

// TestStackText: a stack trace is stored whole up to MaxStackText bytes,
// and past that cut after its last whole line that fits, NULs dropped.
func TestStackText(t *testing.T) {
	t.Parallel()
	short := "goroutine 1 [running]:\nmain.f()\n\t/x.go:1 +0x1\x00"
	if got := StackText(short); got != strings.TrimSuffix(short, "\x00") {
		t.Fatalf("short stack changed: %q", got)
	}
	long := "goroutine 1 [running]:\n" + strings.Repeat("main.frame()\n\t/src/main.go:12 +0x1d\n", 1000)
	got := StackText(long)
	if len(got) > MaxStackText {
		t.Fatalf("%d bytes kept, more than %d", len(got), MaxStackText)
	}
	if !strings.HasSuffix(got, "+0x1d\n…(truncated)") || !strings.HasPrefix(got, "goroutine 1 [running]:\nmain.frame()") {
		t.Fatalf("not cut after a whole line: ...%q", got[len(got)-40:])
	}
	if one := StackText(strings.Repeat("é", MaxStackText)); len(one) > MaxStackText || !utf8.ValidString(one) {
		t.Fatalf("a stack without newlines: %d bytes, valid UTF-8 %v", len(one), utf8.ValidString(one))
	}
}
