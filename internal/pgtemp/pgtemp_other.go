//go:build !linux

package pgtemp

import (
	"context"
	"errors"
)

// ErrUnsupported is Start's error where pgtemp does not run: it relies on
// Linux process attributes (a parent-death signal, so that a killed demo or
// test binary takes its server along).
var ErrUnsupported = errors.New("pgtemp: a throwaway PostgreSQL is started on Linux only; " +
	"set DATABASE_URL to a PostgreSQL you run (docker run -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres)")

// Options configures Start. Where pgtemp does not run, none is used.
type Options struct{}

// Server is a running throwaway PostgreSQL cluster; where pgtemp does not
// run, there is none.
type Server struct{}

// Start returns ErrUnsupported: pgtemp runs on Linux only.
func Start(context.Context, Options) (*Server, error) { return nil, ErrUnsupported }

// URL is the server's connection URL.
func (s *Server) URL() string { return "" }

// Stop stops the server.
func (s *Server) Stop() error { return nil }
