package longhorizon

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The adapter protocol (issue 15 §1): an adapter is a long-running process
// configured by its environment only; stdout carries one JSON object per line,
// a descriptor first, then every SAMPLE_EVERY_S (aligned to wall-clock
// multiples of it) one line per metric; stderr carries logs; SIGTERM makes it
// flush and exit 0 within 5 s.

// Metric names an adapter reports.
const (
	MetricClaimP50   = "claim_p50_ms"
	MetricClaimP95   = "claim_p95_ms"
	MetricClaimP99   = "claim_p99_ms"
	MetricEnqueue    = "enqueue_rate"
	MetricCompletion = "completion_rate"
	MetricDepth      = "queue_depth"
	MetricTargetRate = "producer_target_rate" // instance 0's own offered rate
)

// Descriptor is an adapter's first line.
type Descriptor struct {
	Kind          string          `json:"kind"`
	System        string          `json:"system"`
	EventTables   []string        `json:"event_tables"`
	Extensions    []string        `json:"extensions"`
	Version       json.RawMessage `json:"version"`
	SchemaVersion json.RawMessage `json:"schema_version"`
	DBName        string          `json:"db_name"`
	StartedAt     json.RawMessage `json:"started_at"`
}

// Point is one metric line of one replica.
type Point struct {
	T       time.Time
	Replica int
	Metric  string
	Value   float64
	WindowS float64
}

// ErrProtocol wraps every malformed adapter line.
var ErrProtocol = errors.New("adapter protocol")

type rawLine struct {
	T           json.RawMessage `json:"t"`
	System      string          `json:"system"`
	Kind        string          `json:"kind"`
	SubjectKind string          `json:"subject_kind"`
	Metric      string          `json:"metric"`
	Value       *float64        `json:"value"`
	WindowS     float64         `json:"window_s"`
}

// ParseDescriptor parses an adapter's first line.
func ParseDescriptor(line []byte) (Descriptor, error) {
	var d Descriptor
	if err := json.Unmarshal(line, &d); err != nil {
		return d, fmt.Errorf("%w: descriptor: %v", ErrProtocol, err)
	}
	switch {
	case d.Kind != "descriptor":
		return d, fmt.Errorf("%w: first line has kind %q, want \"descriptor\"", ErrProtocol, d.Kind)
	case d.System == "":
		return d, fmt.Errorf("%w: descriptor without system", ErrProtocol)
	case len(d.EventTables) == 0:
		return d, fmt.Errorf("%w: descriptor without event_tables", ErrProtocol)
	}
	return d, nil
}

// ParsePoint parses one metric line. system is the descriptor's.
func ParsePoint(line []byte, system string) (Point, error) {
	var r rawLine
	if err := json.Unmarshal(line, &r); err != nil {
		return Point{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	switch {
	case r.Kind != "adapter":
		return Point{}, fmt.Errorf("%w: kind %q, want \"adapter\"", ErrProtocol, r.Kind)
	case r.System != system:
		return Point{}, fmt.Errorf("%w: system %q, descriptor said %q", ErrProtocol, r.System, system)
	case r.Metric == "":
		return Point{}, fmt.Errorf("%w: metric line without metric", ErrProtocol)
	case r.Value == nil:
		return Point{}, fmt.Errorf("%w: %s without value", ErrProtocol, r.Metric)
	}
	t, err := parseT(r.T)
	if err != nil {
		return Point{}, err
	}
	return Point{T: t, Metric: r.Metric, Value: *r.Value, WindowS: r.WindowS}, nil
}

// parseT accepts RFC 3339 strings and Unix times in seconds (fractional
// allowed) or milliseconds (numbers above 1e12).
func parseT(raw json.RawMessage) (time.Time, error) {
	if len(raw) == 0 {
		return time.Time{}, fmt.Errorf("%w: line without t", ErrProtocol)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return t, nil
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return unixFloat(f), nil
		}
		return time.Time{}, fmt.Errorf("%w: t %q is neither RFC 3339 nor a Unix time", ErrProtocol, s)
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		return time.Time{}, fmt.Errorf("%w: t %s: %v", ErrProtocol, raw, err)
	}
	return unixFloat(f), nil
}

func unixFloat(f float64) time.Time {
	if f > 1e12 {
		f /= 1000
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9))
}

// replica is one running adapter process.
type replica struct {
	idx     int
	cmd     *exec.Cmd
	started time.Time
	desc    chan Descriptor // receives the descriptor once
	done    chan struct{}   // closed when the process has exited and stdout is read
	exitErr error
	exited  time.Time
}

// sink collects every replica's points and protocol errors of one system run.
type sink struct {
	mu        sync.Mutex
	points    []Point
	protoErrs []string
	raw       io.Writer // every stdout line, wrapped with its replica index
}

func (s *sink) addPoint(p Point) {
	s.mu.Lock()
	s.points = append(s.points, p)
	s.mu.Unlock()
}

func (s *sink) protoErr(idx int, err error) {
	s.mu.Lock()
	if len(s.protoErrs) < 20 {
		s.protoErrs = append(s.protoErrs, fmt.Sprintf("replica %d: %v", idx, err))
	}
	s.mu.Unlock()
}

func (s *sink) writeRaw(idx int, line []byte) {
	s.mu.Lock()
	fmt.Fprintf(s.raw, "{\"replica\":%d,\"line\":%s}\n", idx, jsonOrString(line))
	s.mu.Unlock()
}

func jsonOrString(line []byte) []byte {
	if json.Valid(line) {
		return line
	}
	b, _ := json.Marshal(string(line))
	return b
}

// startReplica starts argv with env added to the driver's environment; its
// stderr is appended to logPath, its stdout parsed into s.
func startReplica(idx int, argv, env []string, logPath string, s *sink) (*replica, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	fmt.Fprintf(logf, "--- driver: starting replica %d at %s: %v %v\n", idx, time.Now().UTC().Format(time.RFC3339), env, argv)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %v: %w", argv, err)
	}
	r := &replica{idx: idx, cmd: cmd, started: time.Now(), desc: make(chan Descriptor, 1), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer logf.Close()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		var system string
		for sc.Scan() {
			line := sc.Bytes()
			s.writeRaw(idx, line)
			if system == "" {
				d, err := ParseDescriptor(line)
				if err != nil {
					s.protoErr(idx, err)
					continue
				}
				system = d.System
				r.desc <- d
				continue
			}
			p, err := ParsePoint(line, system)
			if err != nil {
				s.protoErr(idx, err)
				continue
			}
			p.Replica = idx
			s.addPoint(p)
		}
		r.exitErr = cmd.Wait()
		r.exited = time.Now()
	}()
	return r, nil
}

// terminate sends SIGTERM and waits up to grace for the exit; past grace it
// sends SIGKILL. It returns how long the exit took and whether it was clean
// (exit 0 within grace).
func (r *replica) terminate(grace time.Duration) (time.Duration, bool) {
	sent := time.Now()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
		return r.exited.Sub(sent), r.exitErr == nil
	case <-time.After(grace):
		_ = r.cmd.Process.Kill()
		<-r.done
		return r.exited.Sub(sent), false
	}
}

// kill sends SIGKILL and waits for the exit.
func (r *replica) kill() {
	_ = r.cmd.Process.Kill()
	<-r.done
}
