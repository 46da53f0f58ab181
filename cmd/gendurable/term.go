package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/benchrun"
)

// Everything the CLI prints that came from the database (queue, machine,
// step and signal names, states, payloads, error texts) or from another
// operator goes through printable (text) or printJSON (--json): a name like
// "\x1b[2J\x1b]0;pwned\a" must show as that text, not clear the operator's
// screen or retitle the terminal.

// printable returns s with every character a terminal could act on made
// visible: C0 controls (tab and newline included, so a value cannot break a
// table row or forge a line), DEL and C1 controls as \xHH or \u00HH,
// bidirectional controls (U+202E and its kin, which would show the text
// around them in another order than it is stored) as \uHHHH, and each
// byte of invalid UTF-8 as \xHH. Other text, backslashes included, is left
// as it is.
func printable(s string) string {
	if isPrintable(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case (r >= 0x80 && r < 0xa0) || unicode.Is(unicode.Bidi_Control, r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// isPrintable reports whether printable would return s unchanged.
func isPrintable(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || r < 0xa0 || unicode.Is(unicode.Bidi_Control, r) {
			return false
		}
		i += size
	}
	return true
}

// oneLine is s on one line (runs of white space become one space), at most
// n bytes of it (cut at a character boundary, "…" marks the cut), made
// printable.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		cut := n
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return printable(s)
}

// printJSON writes v as indented JSON. encoding/json escapes C0 controls in
// strings but writes DEL, C1 controls (U+0080–U+009F) and bidirectional
// controls (U+202E, ...) as they are, also inside json.RawMessage values
// read from jsonb; those are escaped here as \uHHHH too, which leaves the
// JSON value unchanged (such characters can only occur inside strings).
func printJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(inertJSON(buf.Bytes()))
	return err
}

// inertJSON returns the JSON text out with DEL, C1 controls and
// bidirectional controls written as \uHHHH escapes (the same JSON value:
// such characters can only occur inside strings), so that no terminal
// acts on them. The CLI's JSON log lines go through it too.
func inertJSON(out []byte) []byte {
	if !bytes.ContainsFunc(out, inert) {
		return out // the common case: nothing to escape
	}
	var b bytes.Buffer
	for i := 0; i < len(out); {
		r, size := utf8.DecodeRune(out[i:])
		if inert(r) {
			fmt.Fprintf(&b, `\u%04x`, r)
		} else {
			b.Write(out[i : i+size])
		}
		i += size
	}
	return b.Bytes()
}

// inert reports whether r is a character inertJSON escapes: DEL, a C1
// control or a bidirectional control.
func inert(r rune) bool {
	return r == 0x7f || (r >= 0x80 && r < 0xa0) || unicode.Is(unicode.Bidi_Control, r)
}

// prompt asks question on out and reads one line from in: true for y or
// yes (any case), false for anything else, an empty line or end of input.
func prompt(in io.Reader, out io.Writer, question string) (bool, error) {
	if _, err := fmt.Fprintf(out, "%s [y/N] ", printable(question)); err != nil {
		return false, err
	}
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}

// confirmer is the Confirm of demo and bench: --reset-schema already said
// yes, so it asks again only on a terminal, and not with --yes.
func confirmer(stderr io.Writer, yes bool) func(string) (bool, error) {
	return func(question string) (bool, error) {
		if yes || !benchrun.IsTerminal(os.Stdin) {
			return true, nil
		}
		return prompt(os.Stdin, stderr, question)
	}
}
