package sqlq

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
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
