package sqlq

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestErrAttrsCarryThePoolerAdvice: an engine started behind PgBouncer in
// transaction pooling with pgx's default statement cache passes Start
// when its statements happen not to collide, then every pick and sweep
// fails with "prepared statement ... already exists": their log lines now
// carry the advice Start would have given.
func TestErrAttrsCarryThePoolerAdvice(t *testing.T) {
	clash := fmt.Errorf("pick: %w", &pgconn.PgError{Code: "42P05", Message: `prepared statement "stmtcache_1" already exists`})
	require.Equal(t, []any{"err", clash, "advice", PoolerHint}, ErrAttrs(clash))
	gone := &pgconn.PgError{Code: "26000", Message: `prepared statement "stmtcache_2" does not exist`}
	require.Equal(t, []any{"err", gone, "advice", PoolerHint}, ErrAttrs(gone))
	plain := errors.New("connection refused")
	require.Equal(t, []any{"err", plain}, ErrAttrs(plain))
}

// TestCatalogRaceIsOnlyACacheLookupThatFailed: a migration (and a scratch
// schema's drop) tries again on PostgreSQL's internal error for a catalog
// entry another transaction dropped under its reads — it failed a full
// test run's drop of one schema while others' were dropped beside it — and
// on no other internal error.
func TestCatalogRaceIsOnlyACacheLookupThatFailed(t *testing.T) {
	race := fmt.Errorf("migrate: %w", &pgconn.PgError{Code: "XX000", Message: "cache lookup failed for relation 100387"})
	require.True(t, CatalogRace(race))
	require.False(t, CatalogRace(&pgconn.PgError{Code: "XX000", Message: "could not read block 0 in file"}))
	require.False(t, CatalogRace(&pgconn.PgError{Code: "42P01", Message: "cache lookup failed"}))
	require.False(t, CatalogRace(errors.New("cache lookup failed for relation 1")))
	require.False(t, CatalogRace(nil))
}
