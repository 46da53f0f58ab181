package compare

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSnap is this process's CPU time and the machine's busy CPU time.
type cpuSnap struct {
	self    time.Duration
	busy    time.Duration // all CPUs, from /proc/stat; 0 where unavailable
	hasBusy bool
}

func readCPU() cpuSnap {
	var s cpuSnap
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.busy, s.hasBusy = machineBusy()
	return s
}

// machineBusy reads the aggregate "cpu" line of /proc/stat: everything but
// idle and iowait, in USER_HZ ticks (100 per second on Linux).
func machineBusy() (time.Duration, bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, false
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, v := range fields[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false
		}
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 8 { // guest, guest_nice are already counted in user, nice
			break
		}
		busy += n
	}
	return time.Duration(busy) * (time.Second / 100), true
}

// selfCPU is this process's CPU time (user + system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAvg1 is the machine's 1-minute load average from /proc/loadavg (-1
// where unavailable).
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	x, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return x
}
