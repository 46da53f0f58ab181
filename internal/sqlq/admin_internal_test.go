package sqlq

import (
	"strconv"
	"testing"
)

// TestSlotTimeLenIsSlotKeyTimeLen: newestSlotSQL cuts a slot's time off its
// key by slotTimeLen bytes, the length of the time the keys end in.
func TestSlotTimeLenIsSlotKeyTimeLen(t *testing.T) {
	if slotTimeLen != strconv.Itoa(SlotKeyTimeLen) {
		t.Fatalf("slotTimeLen %q, SlotKeyTimeLen %d", slotTimeLen, SlotKeyTimeLen)
	}
}
