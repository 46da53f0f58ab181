package sqlq

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
)

// Machine definitions (schema version 7, docs/design.md §9): written when an
// engine starts and merged now and then, read by the graph. None of it is
// on the hot path.

// MaxObservedEdges bounds the observed transitions kept per machine
// version: the most taken ones stay.
const MaxObservedEdges = 1024

// upsertMachinesSQL writes every definition of $1 (a JSON array of
// MachineDef, sorted by name and version so that engines starting at once
// lock the rows in the same order) in one statement. A definition that
// did not change only has its seen_at moved. It returns the rows whose
// definition changed (not the new ones).
const upsertMachinesSQL = `
INSERT INTO {{schema}}.gendurable_machines AS m (name, version, start_step, steps, flow)
SELECT e.doc->>'name', (e.doc->>'version')::int, e.doc->>'start', e.doc->'steps',
       nullif(e.doc->'flow', 'null'::jsonb)
FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS e(doc, ord)
ORDER BY e.ord
ON CONFLICT (name, version) DO UPDATE
SET start_step = excluded.start_step, steps = excluded.steps, flow = excluded.flow,
    updated_at = CASE WHEN (m.start_step, m.steps, m.flow) IS DISTINCT FROM (excluded.start_step, excluded.steps, excluded.flow)
                      THEN now() ELSE m.updated_at END,
    seen_at = now()
RETURNING m.name, m.version, m.updated_at = now() AND m.registered_at <> now() AS changed`

// MachineDef is one machine version's definition as an engine writes it.
type MachineDef struct {
	Name    string     `json:"name"`
	Version int        `json:"version"`
	Start   string     `json:"start"`
	Steps   []string   `json:"steps"`
	Flow    []FlowRule `json:"flow"` // nil: none declared
}

// FlowRule is one declared step of a machine's flow.
type FlowRule struct {
	Step  string   `json:"step"`
	To    []string `json:"to"`
	Kinds []string `json:"kinds"`
}

// ChangedDef names a stored definition an upsert replaced.
type ChangedDef struct {
	Name    string
	Version int
}

// UpsertMachines writes defs (sorted by name, version) in one statement and
// returns those whose stored definition differed.
func (q *Queries) UpsertMachines(ctx context.Context, db DB, defs []MachineDef) ([]ChangedDef, error) {
	doc, err := json.Marshal(defs)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, q.upsertMachines, string(doc))
	if err != nil {
		return nil, err
	}
	var out []ChangedDef
	for rows.Next() {
		var c ChangedDef
		var changed bool
		if err := rows.Scan(&c.Name, &c.Version, &changed); err != nil {
			rows.Close()
			return nil, err
		}
		if changed {
			out = append(out, c)
		}
	}
	return out, rows.Err()
}

// mergeObservedSQL adds counts of transitions taken to the stored ones of
// their machine versions. The rows are locked in (name, version) order first,
// so that engines flushing at once do not deadlock; each keeps at most
// MaxObservedEdges transitions, the most taken.
const mergeObservedSQL = `
WITH d AS (
  SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::text[], $6::bigint[])
    AS d(name, version, f, t, o, n)
), locked AS (
  SELECT m.name, m.version FROM {{schema}}.gendurable_machines AS m
  WHERE (m.name, m.version) IN (SELECT d.name, d.version FROM d)
  ORDER BY m.name, m.version
  FOR NO KEY UPDATE
)
UPDATE {{schema}}.gendurable_machines AS m
SET observed = (
      SELECT coalesce(jsonb_agg(jsonb_build_object('from', x.f, 'to', x.t, 'outcome', x.o, 'count', x.n)
                                ORDER BY x.f, x.t, x.o), '[]'::jsonb)
      FROM (
        SELECT u.f, u.t, u.o, sum(u.n)::bigint AS n FROM (
          SELECT r."from" AS f, r."to" AS t, r.outcome AS o, r.count AS n
          FROM jsonb_to_recordset(m.observed) AS r("from" text, "to" text, outcome text, count bigint)
          UNION ALL
          SELECT d.f, d.t, d.o, d.n FROM d WHERE d.name = m.name AND d.version = m.version
        ) AS u
        GROUP BY u.f, u.t, u.o
        ORDER BY n DESC, u.f, u.t, u.o
        LIMIT $7
      ) AS x),
    observed_at = now()
FROM locked
WHERE m.name = locked.name AND m.version = locked.version`

// ObservedDelta is a count of one transition taken, to merge.
type ObservedDelta struct {
	Name     string
	Version  int
	From, To string
	Outcome  string
	Count    int64
}

// MergeObserved adds deltas to the stored observed transitions in one
// statement. Deltas of a machine version without a stored definition are
// dropped.
func (q *Queries) MergeObserved(ctx context.Context, db DB, deltas []ObservedDelta) error {
	if len(deltas) == 0 {
		return nil
	}
	n := len(deltas)
	names, froms, tos, outs := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	versions, counts := make([]int32, n), make([]int64, n)
	for i, d := range deltas {
		names[i], versions[i], froms[i], tos[i], outs[i], counts[i] = d.Name, int32(d.Version), d.From, d.To, d.Outcome, d.Count
	}
	_, err := db.Exec(ctx, q.mergeObserved, names, versions, froms, tos, outs, counts, MaxObservedEdges)
	return err
}

const storedMachinesSQL = `
SELECT name, version, start_step, steps, flow, observed, registered_at, updated_at, seen_at, observed_at
FROM {{schema}}.gendurable_machines
WHERE $1::text IS NULL OR name = $1
ORDER BY name, version
LIMIT $2`

// StoredMachine is one stored definition with what was observed of it.
type StoredMachine struct {
	MachineDef
	Observed     []ObservedEdge
	RegisteredAt time.Time
	UpdatedAt    time.Time
	SeenAt       time.Time
	ObservedAt   *time.Time
}

// ObservedEdge is one stored observed transition.
type ObservedEdge struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Outcome string `json:"outcome"`
	Count   int64  `json:"count"`
}

// StoredMachines reads up to limit stored definitions, of one machine when
// name is not nil, by name and version.
func (q *Queries) StoredMachines(ctx context.Context, db DB, name *string, limit int) ([]StoredMachine, error) {
	rows, err := db.Query(ctx, q.storedMachines, name, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (StoredMachine, error) {
		var m StoredMachine
		var steps, flow, observed []byte
		if err := row.Scan(&m.Name, &m.Version, &m.Start, &steps, &flow, &observed,
			&m.RegisteredAt, &m.UpdatedAt, &m.SeenAt, &m.ObservedAt); err != nil {
			return m, err
		}
		if err := json.Unmarshal(steps, &m.Steps); err != nil {
			return m, err
		}
		if flow != nil {
			if err := json.Unmarshal(flow, &m.Flow); err != nil {
				return m, err
			}
		}
		return m, json.Unmarshal(observed, &m.Observed)
	})
}
