package riverlh

import "runtime/debug"

// riverVersion is the River module this binary was built with.
func riverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				return "river " + d.Version
			}
		}
	}
	return "unknown"
}
