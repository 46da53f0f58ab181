package main

import (
	"context"
	"io"
)

// uiCmd serves the dashboard (filled in with the dashboard package).
func uiCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return usageError{"ui: the dashboard is not built into this binary yet"}
}
