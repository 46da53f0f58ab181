package sqlq

import (
	"slices"
	"testing"
)

func TestOwnTablesAreTheMigrationsTables(t *testing.T) {
	got := slices.Sorted(slices.Values(ownTables()))
	want := []string{"gendurable_instances", "gendurable_key_buckets", "gendurable_machines", "gendurable_queues", "gendurable_signals"}
	if !slices.Equal(got, want) {
		t.Fatalf("ownTables() = %v, want %v", got, want)
	}
}
