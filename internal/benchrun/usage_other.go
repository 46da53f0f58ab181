//go:build !unix

package benchrun

// resources is what the process has used so far.
type resources struct {
	cpu      float64 // user + system CPU seconds
	maxRSSMB float64 // peak resident set, MB
}

// usage is zero where getrusage is not available: the report's CPU and
// memory figures read 0.
func usage() resources { return resources{} }
