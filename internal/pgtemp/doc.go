// Package pgtemp starts private, throwaway PostgreSQL clusters from the
// locally installed server binaries (initdb and postgres), for tests, demos
// and chaos experiments.
//
// Each [Server] lives in a fresh temporary directory (created with
// os.MkdirTemp under os.TempDir) that holds the data directory and the Unix
// socket, listens only on 127.0.0.1 and is tuned for speed rather than
// durability (fsync, synchronous_commit and full_page_writes are off). The
// superuser is "postgres" with trust authentication, so
// [Server.URL] needs no password. [Server.Stop] shuts the cluster down and
// deletes the directory.
//
// Typical use in a test:
//
//	srv, err := pgtemp.Start(ctx, pgtemp.Options{})
//	if err != nil {
//		t.Fatal(err)
//	}
//	t.Cleanup(func() { _ = srv.Stop() })
//	conn, err := pgx.Connect(ctx, srv.URL())
//
// # Running as root
//
// PostgreSQL refuses to run as root. When the calling process has effective
// uid 0, pgtemp runs initdb and postgres as an unprivileged user instead
// ([Options.OSUser]; by default the "postgres" system user if it exists,
// otherwise "nobody") and hands the temporary directory to that user.
// When not root, the binaries run as the calling user.
//
// # Leftovers
//
// The server processes are started with a parent-death signal (SIGKILL), so a
// test binary that is killed does not leave a postmaster behind; its
// temporary directory (named pgtemp-*) does stay in os.TempDir, though.
//
// The package is Linux-only (it relies on Linux process attributes).
package pgtemp
