//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gendurable/gendurable/internal/pgtemp"
)

// Outage takes a private server down (fast shutdown: every session is
// terminated, new connections are refused) for d, then starts it again and
// waits until it accepts connections. Only for servers the harness started
// itself.
func Outage(ctx context.Context, srv *pgtemp.Server, d time.Duration) error {
	b, err := os.ReadFile(filepath.Join(srv.DataDir(), "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("chaos: outage: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 1 {
		return fmt.Errorf("chaos: outage: bad postmaster.pid %q", first)
	}
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
		return fmt.Errorf("chaos: outage: signalling the postmaster: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			return errors.New("chaos: outage: the postmaster did not exit within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
	}
	return srv.Restart(ctx) // the postmaster is gone: Restart just starts it
}

// skewShim is an LD_PRELOAD library that moves CLOCK_REALTIME (and
// gettimeofday, time) of the process it is loaded into by
// $CHAOS_CLOCK_SKEW_SEC seconds. Loaded into a private PostgreSQL, it gives
// the database a clock that disagrees with the workers' by that much: the
// same as a worker whose clock is skewed by the opposite amount. (A Go
// process's own clock cannot be skewed this way: Go reads the time without
// libc, and Linux time namespaces do not cover CLOCK_REALTIME.)
const skewShim = `
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long skew(void) {
	static int init = 0;
	static long long off = 0;
	if (!init) {
		const char *s = getenv("CHAOS_CLOCK_SKEW_SEC");
		off = s ? atoll(s) : 0;
		init = 1;
	}
	return off;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
	static int (*real)(clockid_t, struct timespec *) = 0;
	if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
	int r = real(id, ts);
	if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += skew();
	return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
	static int (*real)(struct timeval *, void *) = 0;
	if (!real) real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
	int r = real(tv, tz);
	if (r == 0 && tv) tv->tv_sec += skew();
	return r;
}

time_t time(time_t *t) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (t) *t = ts.tv_sec;
	return ts.tv_sec;
}
`

// BuildSkewShim compiles the clock-skew preload library into dir (which it
// makes world-readable, so that an unprivileged postgres can load it) with
// the system C compiler, and returns its path.
func BuildSkewShim(dir string) (string, error) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		if cc, err = exec.LookPath("cc"); err != nil {
			return "", errors.New("chaos: a C compiler (gcc) is needed to build the clock-skew shim")
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	_ = os.Chmod(dir, 0o755)
	src := filepath.Join(dir, "skew.c")
	so := filepath.Join(dir, "skew.so")
	if err := os.WriteFile(src, []byte(skewShim), 0o644); err != nil {
		return "", err
	}
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", so, src, "-ldl").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("chaos: building the clock-skew shim: %v\n%s", err, out)
	}
	_ = os.Chmod(so, 0o755)
	return so, nil
}
