//go:build !linux

package main

import "os/exec"

// worker is a started worker process; done is closed once it has exited.
type worker struct {
	cmd  *exec.Cmd
	done <-chan struct{}
}

// startWorker starts cmd. Without Linux's parent-death signal, a worker
// outlives a demo killed outright (kill -9): stop it yourself.
func startWorker(cmd *exec.Cmd) (*worker, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return &worker{cmd: cmd, done: done}, nil
}
