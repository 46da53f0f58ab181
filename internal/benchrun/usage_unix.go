//go:build unix

package benchrun

import (
	"runtime"
	"syscall"
)

// resources is what the process has used so far.
type resources struct {
	cpu      float64 // user + system CPU seconds
	maxRSSMB float64 // peak resident set, MB
}

// usage reads the process's resource usage (getrusage).
func usage() resources {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	rss := float64(ru.Maxrss) / 1024 // KB on Linux
	if runtime.GOOS == "darwin" {
		rss /= 1024 // bytes there
	}
	return resources{cpu: tv(ru.Utime) + tv(ru.Stime), maxRSSMB: rss}
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
