//go:build linux

package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvWorkerBin names the worker executable; default: this executable (a
// test binary whose TestMain hands over to WorkerMain when $CHAOS_WORKER
// is set, or ./internal/chaos/chaosworker built by hand).
const EnvWorkerBin = "CHAOS_WORKER_BIN"

// Proc is one worker process started by the harness.
type Proc struct {
	Name string
	Cfg  WorkerConfig
	PID  int

	cmd     *exec.Cmd
	done    chan struct{}
	exitErr error
	logPath string

	mu     sync.Mutex
	events []Event
	stderr []string
	ready  chan struct{}
}

// StartWorker starts a worker process with cfg; its stderr goes to a file
// in logDir (and is kept in memory for the harness to search).
func StartWorker(cfg WorkerConfig, logDir string) (*Proc, error) {
	bin := os.Getenv(EnvWorkerBin)
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(workerEnv(), EnvWorker+"="+string(js))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: cfg.Name, Cfg: cfg, cmd: cmd, done: make(chan struct{}), ready: make(chan struct{})}
	var logf io.WriteCloser = nopCloser{io.Discard}
	if logDir != "" {
		_ = os.MkdirAll(logDir, 0o755)
		p.logPath = filepath.Join(logDir, fmt.Sprintf("%s-%d.log", cfg.Name, time.Now().UnixNano()))
		if f, err := os.Create(p.logPath); err == nil {
			logf = f
		}
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p.PID = cmd.Process.Pid
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			var ev Event
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			p.mu.Lock()
			p.events = append(p.events, ev)
			p.mu.Unlock()
			if ev.Ev == "ready" {
				close(p.ready)
			}
		}
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			p.mu.Lock()
			if len(p.stderr) < 20000 {
				p.stderr = append(p.stderr, line)
			}
			p.mu.Unlock()
		}
	}()
	go func() {
		readers.Wait()
		p.exitErr = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// workerEnv is this process's environment without the variables that must
// not leak into a worker (a clock-skew preload meant for a private server,
// a worker config of our own).
func workerEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "LD_PRELOAD" || strings.HasPrefix(k, "CHAOS_CLOCK_") || k == EnvWorker {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// WaitReady waits until the worker has started its engine.
func (p *Proc) WaitReady(timeout time.Duration) error {
	select {
	case <-p.ready:
		return nil
	case <-p.done:
		return fmt.Errorf("worker %s exited before it was ready: %v\n%s", p.Name, p.exitErr, p.StderrTail(20))
	case <-time.After(timeout):
		return fmt.Errorf("worker %s not ready after %s\n%s", p.Name, timeout, p.StderrTail(20))
	}
}

// Alive reports whether the process is still running.
func (p *Proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// ExitErr is the process's exit status once Done is closed.
func (p *Proc) ExitErr() error { <-p.done; return p.exitErr }

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop SIGSTOPs the process and returns once the kernel shows every one of
// its threads stopped (state T in /proc/<pid>/task/*/stat), so that whatever
// the harness records next happens while the process cannot run.
func (p *Proc) Stop(timeout time.Duration) error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(time.Millisecond) {
		if stopped(p.PID) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("worker %s (pid %d) not stopped %s after SIGSTOP", p.Name, p.PID, timeout)
		}
	}
}

// stopped reports whether every thread of process pid is stopped.
func stopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, t := range tasks {
		if statState(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name())) != 'T' {
			return false
		}
	}
	return true
}

// ProcState is the state letter of process pid in /proc/<pid>/stat (R, S,
// T, ...), or 0 if it cannot be read.
func ProcState(pid int) byte { return statState(fmt.Sprintf("/proc/%d/stat", pid)) }

func statState(path string) byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	// pid (comm) state ...: comm may hold spaces and parentheses; the state
	// follows the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// Kill SIGKILLs the process and waits for it.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Term asks the worker to stop gracefully (SIGTERM) and waits up to timeout
// for it to exit; it returns the worker's "stopped" event, if any.
func (p *Proc) Term(timeout time.Duration) (*Event, error) {
	_ = p.WaitReady(timeout) // a worker just (re)started: let it come up first
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		// Its goroutines' stacks to its log (the Go runtime's SIGQUIT dump),
		// to see what it was waiting on; then kill it.
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(2 * time.Second):
		}
		p.Kill()
		return nil, fmt.Errorf("worker %s did not stop within %s; killed (goroutine dump in %s)", p.Name, timeout, p.logPath)
	}
	if ev := p.Last("stopped"); ev != nil {
		return ev, nil
	}
	return nil, fmt.Errorf("worker %s exited without a stopped report: %v\n%s", p.Name, p.exitErr, p.StderrTail(20))
}

// Events returns the events of kind ev ("" for all) received so far.
func (p *Proc) Events(ev string) []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Event
	for _, e := range p.events {
		if ev == "" || e.Ev == ev {
			out = append(out, e)
		}
	}
	return out
}

// Last returns the last event of kind ev, or nil.
func (p *Proc) Last(ev string) *Event {
	es := p.Events(ev)
	if len(es) == 0 {
		return nil
	}
	return &es[len(es)-1]
}

// Stderr returns the stderr lines containing substr ("" for all).
func (p *Proc) Stderr(substr string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, l := range p.stderr {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// StderrTail returns the last n stderr lines, joined.
func (p *Proc) StderrTail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	lines := p.stderr[max(0, len(p.stderr)-n):]
	return strings.Join(lines, "\n")
}

// LogPath is the file holding the worker's stderr.
func (p *Proc) LogPath() string { return p.logPath }

// Fleet is a set of named workers that can be killed and restarted.
type Fleet struct {
	LogDir string
	mu     sync.Mutex
	procs  map[string]*Proc
	all    []*Proc // every process ever started, in order
	order  []string
}

// NewFleet returns an empty fleet logging into logDir.
func NewFleet(logDir string) *Fleet { return &Fleet{LogDir: logDir, procs: map[string]*Proc{}} }

// Start starts (or restarts under the same name) a worker and waits until
// it is ready.
func (f *Fleet) Start(cfg WorkerConfig, readyTimeout time.Duration) (*Proc, error) {
	p, err := StartWorker(cfg, f.LogDir)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	if _, ok := f.procs[cfg.Name]; !ok {
		f.order = append(f.order, cfg.Name)
	}
	f.procs[cfg.Name] = p
	f.all = append(f.all, p)
	f.mu.Unlock()
	if readyTimeout > 0 {
		if err := p.WaitReady(readyTimeout); err != nil {
			return p, err
		}
	}
	return p, nil
}

// Get returns the current process of name.
func (f *Fleet) Get(name string) *Proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.procs[name]
}

// Current returns the current process of every name, in start order.
func (f *Fleet) Current() []*Proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*Proc, 0, len(f.order))
	for _, n := range f.order {
		out = append(out, f.procs[n])
	}
	return out
}

// All returns every process ever started.
func (f *Fleet) All() []*Proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Proc(nil), f.all...)
}

// KillAll SIGKILLs every live process.
func (f *Fleet) KillAll() {
	for _, p := range f.All() {
		if p.Alive() {
			p.Kill()
		}
	}
}

// TermAll stops every current live process gracefully and returns their
// stopped events (nil entries for those that did not report).
func (f *Fleet) TermAll(timeout time.Duration) ([]*Event, error) {
	var procs []*Proc
	for _, p := range f.Current() {
		if p.Alive() {
			procs = append(procs, p)
		}
	}
	evs := make([]*Event, len(procs))
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs[i], errs[i] = p.Term(timeout)
		}()
	}
	wg.Wait()
	return evs, errors.Join(errs...)
}
