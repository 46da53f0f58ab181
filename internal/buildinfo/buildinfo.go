// Package buildinfo reads what the Go toolchain recorded about the running
// binary: its module version and the VCS revision it was built from. The
// CLI's `version` command and the long-horizon adapter's descriptor print
// it.
package buildinfo

import "runtime/debug"

// Info is the running binary's build information.
type Info struct {
	Known    bool   // the binary carries build information
	Version  string // the main module's version, "(devel)" for a build from a checkout
	Revision string // the VCS revision it was built from, if recorded
	Modified bool   // built from a checkout with uncommitted changes
}

// Read reads the running binary's build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{}
	}
	in := Info{Known: true, Version: bi.Main.Version}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// Short names the build in one word: its module version, else its VCS
// revision ("-dirty" when modified), else "devel" ("unknown" without build
// information).
func (in Info) Short() string {
	switch {
	case !in.Known:
		return "unknown"
	case in.Version != "" && in.Version != "(devel)":
		return in.Version
	case in.Revision == "":
		return "devel"
	case in.Modified:
		return in.Revision + "-dirty"
	}
	return in.Revision
}
