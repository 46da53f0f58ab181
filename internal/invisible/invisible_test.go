package invisible

import "testing"

// TestInName: every character a hostile-operator probe found passing for
// nothing in a name is refused (the first list had U+00AD, U+180E, U+200B,
// U+2060–U+2064, U+FEFF and the tags only); the joiners and visible text
// are not.
func TestInName(t *testing.T) {
	for _, r := range []rune{
		0x00AD, 0x180E, 0x200B, 0x2060, 0x2064, 0xFEFF, 0xE0001, 0xE0020, 0xE007F, // the first list
		0x206A, 0x206F, 0x2065, 0xFFF9, 0xFFFB, 0x1D173, 0x1D17A, 0x1BCA0, 0x1BCA3, 0x13430, // format characters
		0x3164, 0x115F, 0x1160, 0xFFA0, 0x2800, 0x034F, 0x17B4, 0x17B5, // fillers, blanks, a joiner
		0xFE00, 0xFE0F, 0xE0100, 0xE01EF, 0x180B, 0x180D, // variation selectors
	} {
		if !InName(r) {
			t.Errorf("InName(%U) = false, want true", r)
		}
	}
	for _, r := range "pay-ments_1 .:/ éñ中文 😀🇫🇷 \u200c\u200d\u0600\u0645\u0915\u094d\t\x00\x85" {
		if InName(r) {
			t.Errorf("InName(%U) = true, want false", r)
		}
	}
}

// TestEscaped: the terminal escapes what a name may not hold, but the tags
// of subdivision flags and the emoji presentation selectors.
func TestEscaped(t *testing.T) {
	for _, r := range []rune{0x200B, 0xFEFF, 0x206F, 0x3164, 0xFE00, 0x2800} {
		if !Escaped(r) {
			t.Errorf("Escaped(%U) = false, want true", r)
		}
	}
	for _, r := range []rune{0xE0067, 0xE007F, 0xFE0E, 0xFE0F, 0x200D, 'a'} {
		if Escaped(r) {
			t.Errorf("Escaped(%U) = true, want false", r)
		}
	}
}

// TestIndexInName: a variation selector stands where it selects a form —
// after an emoji, a CJK ideograph, a Mongolian letter, in a keycap — and is
// refused at the start, after ASCII text or white space (a review: the
// first form refused every one, and with it "alerts-⚠️", "❤️", "1️⃣",
// "🏳️‍🌈", Mongolian words and Japanese names).
func TestIndexInName(t *testing.T) {
	for _, ok := range []string{"alerts-\u26a0\ufe0f", "\u2764\ufe0f", "1\ufe0f\u20e3", "\U0001F3F3\ufe0f\u200d\U0001F308",
		"\u1824\u180b\u1820", "\u845b\U000E0100\u57ce", "pay", "mi\u200cxed", "text\u2764\ufe0e"} {
		if i := IndexInName(ok); i >= 0 {
			t.Errorf("IndexInName(%+q) = %d, want -1", ok, i)
		}
	}
	for _, c := range []struct {
		name string
		at   int
	}{
		{"default\ufe0f", 7}, {"\ufe0fx", 0}, {"a \ufe0f", 2}, {"1\ufe0f", 1}, {"pay\u3164", 3},
		{"\u26a0\u3164\ufe0f", 3}, {"q\u200b", 1}, {"x\U000E0100", 1},
	} {
		if i := IndexInName(c.name); i != c.at {
			t.Errorf("IndexInName(%+q) = %d, want %d", c.name, i, c.at)
		}
	}
}
