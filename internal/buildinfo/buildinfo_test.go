package buildinfo

import "testing"

func TestShort(t *testing.T) {
	for _, c := range []struct {
		in   Info
		want string
	}{
		{Info{}, "unknown"},
		{Info{Known: true, Version: "v1.2.3", Revision: "abc"}, "v1.2.3"},
		{Info{Known: true, Version: "(devel)", Revision: "abc"}, "abc"},
		{Info{Known: true, Version: "(devel)", Revision: "abc", Modified: true}, "abc-dirty"},
		{Info{Known: true, Version: "(devel)"}, "devel"},
	} {
		if got := c.in.Short(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.in, got, c.want)
		}
	}
	if in := Read(); !in.Known {
		t.Error("a test binary carries build information")
	}
}
