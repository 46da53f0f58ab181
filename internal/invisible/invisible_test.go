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
