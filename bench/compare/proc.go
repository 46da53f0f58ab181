package compare

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// lockedWriter serializes writes from worker processes' stderr copiers and
// the comparison's own progress lines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// workerProc is the comparison's side of one worker process.
type workerProc struct {
	idx    int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	notify chan struct{}
	exited chan struct{} // closed once stdout is drained and the process waited for

	mu        sync.Mutex
	ready     bool
	started   bool
	startNs   int64 // wall clock before its Start call
	startDur  time.Duration
	count     int64
	lastNs    int64
	cpu       time.Duration // since before Start, as of the last progress line
	stopped   bool
	stopDur   time.Duration
	anomalies int64
	latency   *latencyReport
	protoErr  error
	waitErr   error
}

// workerGroup is the worker processes of one run.
type workerGroup struct {
	procs  []*workerProc
	notify chan struct{}
}

// spawnWorkers starts n worker processes of spec (this binary, re-executed
// with the spec in its environment) and waits until each has its pool open
// and its client or engine built.
func spawnWorkers(ctx context.Context, spec workerSpec, n int, logw io.Writer) (*workerGroup, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	g := &workerGroup{notify: make(chan struct{}, 1)}
	for i := range n {
		spec.Index = i
		b, err := json.Marshal(spec)
		if err != nil {
			g.kill()
			return nil, fmt.Errorf("encode worker spec: %w", err)
		}
		p := &workerProc{idx: i, notify: g.notify, exited: make(chan struct{})}
		p.cmd = exec.Command(exe)
		p.cmd.Env = append(os.Environ(), workerEnv+"="+string(b))
		p.cmd.Stderr = logw
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			g.kill()
			return nil, fmt.Errorf("worker stdin: %w", err)
		}
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			g.kill()
			return nil, fmt.Errorf("worker stdout: %w", err)
		}
		if err := p.cmd.Start(); err != nil {
			g.kill()
			return nil, fmt.Errorf("start worker process: %w", err)
		}
		g.procs = append(g.procs, p)
		go p.read(stdout)
	}
	err = g.wait(ctx, 60*time.Second, nil, func() bool {
		for _, p := range g.procs {
			if !p.ready {
				return false
			}
		}
		return true
	})
	if err != nil {
		g.kill()
		return nil, fmt.Errorf("worker processes not ready: %w", err)
	}
	return g, nil
}

func (p *workerProc) read(stdout io.Reader) {
	defer func() {
		err := p.cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(p.exited)
		p.poke()
	}()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	for sc.Scan() {
		p.parse(sc.Text())
		p.poke()
	}
}

func (p *workerProc) poke() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

func (p *workerProc) parse(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	verb, rest, _ := strings.Cut(line, " ")
	var err error
	switch verb {
	case "ready":
		p.ready = true
	case "started":
		var d int64
		_, err = fmt.Sscan(rest, &p.startNs, &d)
		p.startDur, p.started = time.Duration(d), true
	case "progress":
		var cpu int64
		_, err = fmt.Sscan(rest, &p.count, &p.lastNs, &cpu)
		p.cpu = time.Duration(cpu)
	case "stopped":
		var d int64
		_, err = fmt.Sscan(rest, &d, &p.anomalies)
		p.stopDur, p.stopped = time.Duration(d), true
	case "latency":
		var l latencyReport
		err = json.Unmarshal([]byte(rest), &l)
		p.latency = &l
	default:
		err = fmt.Errorf("unknown line %q", line)
	}
	if err != nil && p.protoErr == nil {
		p.protoErr = fmt.Errorf("worker %d: %q: %w", p.idx, line, err)
	}
}

func (g *workerGroup) send(cmd string) error {
	var errs []error
	for _, p := range g.procs {
		if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
			errs = append(errs, fmt.Errorf("worker %d: %w", p.idx, err))
		}
	}
	return errors.Join(errs...)
}

// lock runs f with every process's state locked.
func (g *workerGroup) lock(f func()) {
	for _, p := range g.procs {
		p.mu.Lock()
	}
	defer func() {
		for _, p := range g.procs {
			p.mu.Unlock()
		}
	}()
	f()
}

// completed is the completions counted across the processes.
func (g *workerGroup) completed() int64 {
	var n int64
	g.lock(func() {
		for _, p := range g.procs {
			n += p.count
		}
	})
	return n
}

// wait waits until done (called with every process's state locked) holds,
// a process fails, ctx ends or timeout passes; tick, if not nil, runs every
// two seconds.
func (g *workerGroup) wait(ctx context.Context, timeout time.Duration, tick func(), done func() bool) error {
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	tk := time.NewTicker(2 * time.Second)
	defer tk.Stop()
	for {
		var ok bool
		var err error
		g.lock(func() {
			for _, p := range g.procs {
				if p.protoErr != nil {
					err = p.protoErr
					return
				}
			}
			ok = done()
			if ok {
				return
			}
			for _, p := range g.procs {
				select {
				case <-p.exited:
					err = fmt.Errorf("worker process %d exited early: %v", p.idx, p.waitErr)
					return
				default:
				}
			}
		})
		if ok || err != nil {
			return err
		}
		select {
		case <-g.notify:
		case <-tk.C:
			if tick != nil {
				tick()
			}
		case <-tm.C:
			return fmt.Errorf("timed out after %s", timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stop asks every process to stop and waits for them to exit.
func (g *workerGroup) stop(ctx context.Context) error {
	sendErr := g.send("stop")
	var errs []error
	if sendErr != nil {
		errs = append(errs, sendErr)
	}
	tm := time.NewTimer(60 * time.Second)
	defer tm.Stop()
	for _, p := range g.procs {
		_ = p.stdin.Close()
		select {
		case <-p.exited:
		case <-tm.C:
			g.kill()
			return errors.Join(append(errs, errors.New("worker processes did not exit within 60s"))...)
		case <-ctx.Done():
			g.kill()
			return ctx.Err()
		}
		p.mu.Lock()
		switch {
		case p.waitErr != nil:
			errs = append(errs, fmt.Errorf("worker process %d: %w", p.idx, p.waitErr))
		case p.protoErr != nil:
			errs = append(errs, p.protoErr)
		case !p.stopped:
			errs = append(errs, fmt.Errorf("worker process %d exited without stopping", p.idx))
		}
		p.mu.Unlock()
	}
	return errors.Join(errs...)
}

// kill ends the group's processes that are still running (by their own
// handles: only processes this comparison started).
func (g *workerGroup) kill() {
	for _, p := range g.procs {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
}
