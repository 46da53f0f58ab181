package gdotel

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestREADMEListsEveryMetric: every Metric* constant has its row in the
// README's metrics table (gendurable.key.rate_limited had none).
func TestREADMEListsEveryMetric(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "otel.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		spec, ok := node.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range spec.Names {
			if !strings.HasPrefix(name.Name, "Metric") || i >= len(spec.Values) {
				continue
			}
			lit, ok := spec.Values[i].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				continue
			}
			metric, _ := strconv.Unquote(lit.Value)
			n++
			if !strings.Contains(string(readme), "| `"+metric+"` |") {
				t.Errorf("%s (%s) has no row in README.md's metrics table", name.Name, metric)
			}
		}
		return true
	})
	if n < 10 {
		t.Fatalf("found %d Metric constants in otel.go; the test no longer reads them", n)
	}
}
