package display

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestIndentedSizeIsWhatIndentWrites: the size counted without building
// is json.Indent's, byte for byte, for documents of every shape.
func TestIndentedSizeIsWhatIndentWrites(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		`1`, `"a"`, `null`, `{}`, `[]`, `[{}]`, `{"a":[]}`, `[[],[{}],{"x":{}}]`,
		` { "a" : 1 , "b" : [ 1 , 2 , { "c" : "d\"e\\" } ] } `,
		`{"k:,{[":"v]},\\\"","n":[true,false,null,-1.5e3]}`,
		`[` + strings.Repeat(`[`, 50) + `0` + strings.Repeat(`]`, 50) + `]`,
		`{"é":"ü\u00e9","s":"` + strings.Repeat(`x`, 100) + `"}`,
	} {
		var buf bytes.Buffer
		require.NoError(t, json.Indent(&buf, []byte(doc), "", "  "), doc)
		require.Equal(t, buf.Len(), indentedSize([]byte(doc)), doc)
	}
}

// TestIndentKeepsDeepDocumentsCompact: an ordinary document is indented;
// one nested deep enough that indenting would multiply it (2 KB 1,000
// levels deep: 2 MB indented) is compacted instead, and what is not JSON is
// returned as it was.
func TestIndentKeepsDeepDocumentsCompact(t *testing.T) {
	t.Parallel()
	out, ok := Indent([]byte(`{"a": [1, 2], "b": {}}`))
	require.True(t, ok)
	require.Equal(t, "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}", string(out))

	deep := []byte(strings.Repeat(`[`, 1000) + strings.Repeat(`]`, 1000))
	require.Greater(t, indentedSize(deep), 1_000_000)
	out, ok = Indent(deep)
	require.True(t, ok)
	require.Equal(t, deep, out)

	wide := []byte(strings.Repeat(`[`, 999) + strings.Repeat(`0, `, 1000) + `0` + strings.Repeat(`]`, 999))
	out, ok = Indent(wide)
	require.True(t, ok)
	require.Less(t, len(out), len(wide), "compacted")

	out, ok = Indent([]byte(`{"a": `))
	require.False(t, ok)
	require.Equal(t, `{"a": `, string(out))
}

// FuzzIndentedSize: for any valid JSON, the counted size is json.Indent's.
func FuzzIndentedSize(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":"c\\\""}]}`, ` [ ] `, "\n{}\t", `[[[["x"]]]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) {
			return
		}
		var buf bytes.Buffer
		require.NoError(t, json.Indent(&buf, doc, "", "  "))
		require.Equal(t, buf.Len(), indentedSize(doc))
	})
}
