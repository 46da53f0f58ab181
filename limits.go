package gendurable

import "fmt"

// jsonLimits bounds an encoded JSON document (a state, a result, a signal
// payload) before it reaches the database. PostgreSQL parses jsonb
// recursively and rejects a deep enough document with "stack depth limit
// exceeded"; checking here turns that into the caller's typed error, and an
// outcome that could never be written into one that Handle sees before any
// SQL runs.
type jsonLimits struct {
	maxBytes  int    // 0: no bound
	bytesName string // the Config field that sets maxBytes, for the message
	maxDepth  int    // levels of nested arrays and objects; negative: no bound
}

func (l jsonLimits) check(what string, b []byte) error {
	if l.maxBytes > 0 && len(b) > l.maxBytes {
		return fmt.Errorf("%s is %d bytes encoded, over Config.%s %d", what, len(b), l.bytesName, l.maxBytes)
	}
	if jsonDepthOver(b, l.maxDepth) > 0 {
		return fmt.Errorf("%s nests arrays and objects deeper than Config.MaxJSONDepth %d", what, l.maxDepth)
	}
	return nil
}

// jsonDepthOver returns a depth greater than limit if b (valid JSON) nests
// deeper than limit, else 0. A document shorter than limit+1 bytes cannot
// nest that deep, so the common small state costs a length comparison.
func jsonDepthOver(b []byte, limit int) int {
	if limit < 0 || len(b) <= limit {
		return 0
	}
	depth, inString, escaped := 0, false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			if depth++; depth > limit {
				return depth
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return 0
}
