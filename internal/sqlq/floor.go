package sqlq

import (
	"context"
	"strings"
)

// ---------------------------------------------------------------------------
// The physical floor (gendurable bench --floor): the cheapest way PostgreSQL
// can move rows between statuses — a bare UPDATE … FROM unnest by primary key
// flipping the indexed status column, with no fence, no history and nothing
// returned. A job costs two such row writes (its claim and its outcome), so
// half the floor's rows/s is the most jobs/s any engine could reach on the
// same server at the same connection count.

const floorSeedSQL = `
INSERT INTO {{schema}}.gendurable_instances (fsm, step, status)
SELECT 'bench_floor', 'a', 'done' FROM generate_series(1, $1::int)
RETURNING id`

const floorFlipSQL = `
UPDATE {{schema}}.gendurable_instances AS i
SET status = CASE WHEN i.status = 'done' THEN 'runnable' ELSE 'done' END::{{schema}}.gendurable_status,
    updated_at = now()
FROM unnest($1::bigint[]) AS r(id)
WHERE i.id = r.id`

// FloorSeed inserts n finished rows for the floor measurement and returns their ids.
func (q *Queries) FloorSeed(ctx context.Context, db DB, n int) ([]int64, error) {
	rows, err := db.Query(ctx, render(floorSeedSQL, quoteIdent(q.Schema)), n)
	if err != nil {
		return nil, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// FloorFlip flips the status of the rows ids in one statement and returns
// how many it wrote.
func (q *Queries) FloorFlip(ctx context.Context, db DB, ids []int64) (int64, error) {
	tag, err := db.Exec(ctx, render(floorFlipSQL, quoteIdent(q.Schema)), ids)
	return tag.RowsAffected(), err
}

// WearStatistics gives the empty instances table the planner statistics of a
// table in use (docs/design.md §5): it fills it with n finished rows,
// ANALYZEs it, and empties it again; TRUNCATE keeps the statistics, which now
// say that almost every row is done. Benchmarks start from here, so a fresh
// database's flattering plans are not what they measure.
func (q *Queries) WearStatistics(ctx context.Context, db DB, n int) error {
	s := quoteIdent(q.Schema)
	for _, sql := range []string{
		render(`INSERT INTO {{schema}}.gendurable_instances (fsm, step, status, finished_at)
		        SELECT 'worn', 'a', 'done', now() FROM generate_series(1, $1::int)`, s),
		render(`ANALYZE {{schema}}.gendurable_instances`, s),
		render(`TRUNCATE {{schema}}.gendurable_instances`, s),
	} {
		args := []any{}
		if strings.Contains(sql, "$1") {
			args = append(args, n)
		}
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			return err
		}
	}
	return nil
}
