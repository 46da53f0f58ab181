package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/gendurable/gendurable/internal/benchrun"
	"github.com/gendurable/gendurable/internal/display"
)

// Everything the CLI prints that came from the database (queue, machine,
// step and signal names, states, payloads, error texts) or from another
// operator goes through display.Terminal (text) or printJSON (--json): a
// name like "\x1b[2J\x1b]0;pwned\a" must show as that text, not clear the
// operator's screen or retitle the terminal.

// oneLine is s on one line (runs of white space become one space), at most
// n bytes of it (cut at a character boundary, "…" marks the cut), through
// display.Terminal.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		cut := n
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return display.Terminal(s)
}

// printJSON writes v as indented JSON, through display.InertJSON:
// encoding/json escapes C0 controls in strings but writes DEL, C1 controls
// (U+0080–U+009F) and bidirectional controls (U+202E, ...) as they are,
// also inside json.RawMessage values read from jsonb.
//
// It is indented unless indenting would multiply it (display.Indent): each
// line carries its depth, so a state nested 1,000 levels deep printed about
// a thousand times its size; such output is compact.
func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b, _ = display.Indent(b)
	_, err = w.Write(append(display.InertJSON(b), '\n'))
	return err
}

// prompt asks question on out and reads one line from in: true for y or
// yes (any case), false for anything else, an empty line or end of input.
// An interrupt (Ctrl-C, SIGTERM: ctx ends) ends the wait, answered no,
// with ctx's error: before, the command sat at the prompt until a line
// came, deaf to both (a probe: only kill -9 ended it). The read goes on
// in the background until the process exits.
func prompt(ctx context.Context, in io.Reader, out io.Writer, question string) (bool, error) {
	if sw, ok := out.(*syncWriter); ok { // the operator is being asked: no note that the database is slow
		sw.asking(true)
		defer sw.asking(false)
	}
	if _, err := fmt.Fprintf(out, "%s [y/N] ", display.Terminal(question)); err != nil {
		return false, err
	}
	type answer struct {
		line string
		err  error
	}
	read := make(chan answer, 1)
	go func() {
		line, err := bufio.NewReader(in).ReadString('\n')
		read <- answer{line, err}
	}()
	var a answer
	select {
	case a = <-read:
	case <-ctx.Done():
		fmt.Fprintln(out) // the prompt's line ends
		// Interrupted: aborted as a "no" is (code "aborted"), with the cause.
		return false, fmt.Errorf("%w (%w)", errAborted, context.Cause(ctx))
	}
	line, err := a.line, a.err
	if !echoesAnswer(out) || !strings.HasSuffix(line, "\n") {
		// The answer's Enter shows on the terminal, not where the prompt
		// went, and an end of input (Ctrl-D) shows nothing: end its line,
		// or the next line (a JSON error with --json) followed the prompt
		// on it (an operator probe).
		fmt.Fprintln(out)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}

// echoesAnswer reports whether out, where a prompt was written, is a
// terminal: the operator's answer, typed there, ends the prompt's line.
func echoesAnswer(out io.Writer) bool {
	if sw, ok := out.(*syncWriter); ok {
		out = sw.w
	}
	f, ok := out.(*os.File)
	return ok && benchrun.IsTerminal(f)
}

// confirmer is the Confirm of demo and bench, asked before --reset-schema
// drops a schema they did not create: --yes confirms it, a terminal asks,
// and anywhere else (a script, a pipe) it is a usage error that changes
// nothing — as for the other commands that drop or change what they did
// not create (migrate down, a bulk filter, cancel --tree).
func confirmer(ctx context.Context, stderr io.Writer, yes bool) func(string) (bool, error) {
	return func(question string) (bool, error) {
		switch {
		case yes:
			return true, nil
		case !benchrun.IsTerminal(os.Stdin):
			return false, usageError{msg: display.Terminal(question) + " stdin is not a terminal: pass --yes to confirm"}
		}
		return prompt(ctx, os.Stdin, stderr, question)
	}
}
