package main

import (
	"context"
	"fmt"
	"io"
	"runtime"

	"github.com/gendurable/gendurable/internal/buildinfo"
	"github.com/gendurable/gendurable/migrate"
)

// versionInfo is what `gendurable version` prints.
type versionInfo struct {
	Version       string `json:"version"`        // the module's version, "(devel)" for a build from a checkout
	Revision      string `json:"revision"`       // the VCS revision it was built from, if known
	Modified      bool   `json:"modified"`       // built from a checkout with uncommitted changes
	SchemaVersion int    `json:"schema_version"` // the schema version this binary needs (migrate up installs it)
	Go            string `json:"go"`
}

func buildVersion() versionInfo {
	v := versionInfo{Version: "(unknown)", SchemaVersion: migrate.Latest(), Go: runtime.Version()}
	if in := buildinfo.Read(); in.Known {
		v.Version, v.Revision, v.Modified = in.Version, in.Revision, in.Modified
	}
	return v
}

func versionCmd(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlags("version")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	v := buildVersion()
	if *asJSON {
		return printJSON(stdout, v)
	}
	rev := ""
	if v.Revision != "" {
		rev = ", revision " + v.Revision
		if v.Modified {
			rev += " (modified)"
		}
	}
	_, err := fmt.Fprintf(stdout, "gendurable %s%s; schema version %d; %s\n", v.Version, rev, v.SchemaVersion, v.Go)
	return err
}
