// Package invisible says which characters show as nothing where a name or a
// key is printed: the one list behind the names the library refuses and the
// characters the gendurable command writes out as escapes.
package invisible

import (
	"unicode"
	"unicode/utf8"
)

// InName reports whether r shows as nothing, or as a blank that is not white
// space, and has no use inside a name: "pay" followed by one looks like
// "pay" on every page. They are the format characters (general category
// Cf: the zero width space U+200B, the byte order mark U+FEFF, the soft
// hyphen U+00AD, the invisible operators U+2060–U+2064 and U+206A–U+206F,
// the interlinear annotation marks, the tag characters, …), the other
// default ignorable code points (the Hangul fillers U+115F, U+1160, U+3164
// and U+FFA0, the combining grapheme joiner U+034F, …), the variation
// selectors (which [IndexInName] lets stand where they select a form) and
// the braille pattern blank U+2800. Not the zero width
// non-joiner and joiner (U+200C, U+200D), which Persian and Indic words and
// emoji sequences need, nor the prepended concatenation marks (U+0600–U+0605,
// …), which show.
func InName(r rune) bool {
	switch {
	case r < 0xAD:
		return false // ASCII and C1 controls: neither, the callers see to those
	case r == 0x200C, r == 0x200D:
		return false
	case r == 0x2800:
		return true
	case unicode.Is(unicode.Prepended_Concatenation_Mark, r):
		return false
	}
	return unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}

// IndexInName is the offset of the first character of name that InName
// refuses where it stands, or -1. A variation selector picks the form of
// the character before it, so it stands after a visible non-ASCII one (an
// emoji, "⚠️"; a CJK ideograph; a Mongolian letter) and in a keycap (a
// digit, # or * before it, U+20E3 after it); at the start of a name, after
// ASCII text or after white space it changes nothing one sees, and is
// refused there ("default" + U+FE0F looks like "default").
func IndexInName(name string) int {
	prev := rune(-1)
	for i, r := range name {
		if InName(r) && !(unicode.Is(unicode.Variation_Selector, r) && Selects(prev, nextRune(name[i+utf8.RuneLen(r):]))) {
			return i
		}
		prev = r
	}
	return -1
}

// nextRune is the first character of rest, or -1 if it is empty.
func nextRune(rest string) rune {
	if rest == "" {
		return -1
	}
	r, _ := utf8.DecodeRuneInString(rest)
	return r
}

// Selects reports whether a variation selector after prev (-1 at the start
// of the text), followed by next (-1 at its end), selects a form of prev:
// where [IndexInName] lets it stand.
func Selects(prev, next rune) bool {
	switch {
	case prev < 0:
		return false
	case prev < utf8.RuneSelf:
		return (prev >= '0' && prev <= '9' || prev == '#' || prev == '*') && next == 0x20E3 // a keycap
	}
	return !InName(prev) && !unicode.IsSpace(prev) && !unicode.IsControl(prev)
}

// Escaped reports whether text printed for a terminal writes r as an escape
// (internal/display): the characters of [InName] but the tag characters
// (U+E0000–U+E007F: subdivision flags are made of them) and the emoji
// presentation selectors U+FE0E and U+FE0F, which text and emoji use after
// a visible character. A key may hold any of them (a key is the user's
// data); printed, it shows which. The other variation selectors are
// escaped unless they select a form of the character before them
// ([Selects]), as a name may hold them: the caller asks that with the
// characters around. Printed so, a key with such a selector and one
// without it look alike (as they would in any text that shows the form).
func Escaped(r rune) bool {
	switch {
	case r >= 0xE0000 && r <= 0xE007F, r == 0xFE0E, r == 0xFE0F:
		return false
	}
	return InName(r)
}
