package main

import (
	"os/exec"
	"syscall"

	"github.com/gendurable/gendurable/internal/childproc"
)

// worker is a started worker process; done is closed once it has exited.
type worker struct {
	cmd  *exec.Cmd
	done <-chan struct{}
}

// startWorker starts cmd with a parent-death SIGTERM: a worker stops
// cleanly when the demo is killed outright.
func startWorker(cmd *exec.Cmd) (*worker, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	p, err := childproc.Start(cmd, nil)
	if err != nil {
		return nil, err
	}
	return &worker{cmd: cmd, done: p.Done()}, nil
}
