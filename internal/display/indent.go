package display

import (
	"bytes"
	"encoding/json"
)

// indentWidth is what Indent indents each level by: two spaces.
const indentWidth = 2

// Indent is src, a JSON document, indented two spaces a level as
// json.Indent would — unless that would make it more than 8 times its
// length plus 16 KiB, in which case it is src compacted (whitespace outside
// strings removed). Indenting costs each line its depth: a document of 2 KB
// nested 1,000 levels deep (within gendurable's depth limit) indents to
// 2 MB, and one of 200 KB with its values at that depth to 200 MB — a
// dashboard page or a `show --json` printing one built that in memory. The
// size is counted before anything is built. src that is not valid JSON is
// returned as it is, with false.
func Indent(src []byte) ([]byte, bool) {
	var buf bytes.Buffer
	buf.Grow(len(src))
	var err error
	if indentedSize(src) <= 8*len(src)+16<<10 { // counted as if valid: Indent and Compact check
		err = json.Indent(&buf, src, "", "  ")
	} else {
		err = json.Compact(&buf, src)
	}
	if err != nil {
		return src, false
	}
	return buf.Bytes(), true
}

// indentedSize is the length json.Indent(dst, src, "", "  ") gives valid
// JSON src, counted without building it: every byte outside whitespace, a
// space after each colon, and a newline plus its depth's indent after each
// opening bracket of a non-empty object or array, after each comma, and
// before each closing bracket of a non-empty one; and src's trailing white
// space, which json.Indent keeps.
func indentedSize(src []byte) int {
	n, depth := 0, 0
	inString, escaped := false, false
	// pendingOpen: the last token was an opening bracket whose newline is
	// owed unless the next token closes it ({} and [] stay on one line).
	pendingOpen := false
	for _, c := range src {
		if inString {
			n++
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		if pendingOpen {
			pendingOpen = false
			if c != '}' && c != ']' {
				n += 1 + depth*indentWidth
			} else {
				depth--
				n++ // the closing bracket, on the same line
				continue
			}
		}
		switch c {
		case '"':
			inString = true
			n++
		case '{', '[':
			depth++
			n++
			pendingOpen = true
		case '}', ']':
			depth--
			n += 1 + depth*indentWidth + 1
		case ',':
			n += 1 + 1 + depth*indentWidth
		case ':':
			n += 2
		default:
			n++
		}
	}
	// json.Indent drops leading white space and keeps trailing.
	trimmed := bytes.TrimRight(src, " \t\n\r")
	return n + len(src) - len(trimmed)
}
