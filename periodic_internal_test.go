package gendurable

import (
	"strings"
	"testing"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
)

// TestSlotKeysEndInTheirSlotOfAFixedLength: the prune finds a schedule's
// newest slot by the key's last sqlq.SlotKeyTimeLen bytes (its slot, which
// sorts by time), whatever the schedule's name.
func TestSlotKeysEndInTheirSlotOfAFixedLength(t *testing.T) {
	for _, slot := range []time.Time{
		time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 0, time.FixedZone("x", 3600)),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		for _, name := range []string{"a", "with:colons:2026-01-01T00:00:00Z", "ümlaut"} {
			k := slotKey(name, slot)
			if !strings.HasPrefix(k, sqlq.SlotKeyPrefix+name+":") || len(k) != len(sqlq.SlotKeyPrefix+name+":")+sqlq.SlotKeyTimeLen {
				t.Errorf("slot key %q of %q at %s: not the prefix, the name and %d bytes of slot", k, name, slot, sqlq.SlotKeyTimeLen)
			}
		}
	}
}
