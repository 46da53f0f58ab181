package sqlq

import (
	"context"
	"fmt"
	"regexp"
	"strings"
)

// ---------------------------------------------------------------------------
// Scratch schemas: the schemas `gendurable demo` and `gendurable bench`
// create for themselves. Each is marked with a comment when created, and
// only a marked schema is ever dropped without the operator saying so.

// scratchCommentPrefix starts the comment of every scratch schema.
const scratchCommentPrefix = "gendurable scratch schema"

var scratchOwnerRE = regexp.MustCompile(`^[a-z]+$`)

// SchemaInfo is what a schema holds, as far as deciding whether to drop it
// goes.
type SchemaInfo struct {
	Exists     bool
	Comment    string // "" if none
	Objects    int64  // relations, types (other than row and array types) and functions in it
	Gendurable bool   // it holds gendurable_instances
}

// Scratch reports whether the schema carries a scratch mark.
func (s SchemaInfo) Scratch() bool { return strings.HasPrefix(s.Comment, scratchCommentPrefix) }

const schemaInfoSQL = `
SELECT n.oid IS NOT NULL,
       coalesce(obj_description(n.oid, 'pg_namespace'), ''),
       (SELECT count(*) FROM pg_class AS c WHERE c.relnamespace = n.oid)
     + (SELECT count(*) FROM pg_type AS t WHERE t.typnamespace = n.oid AND t.typrelid = 0
          AND NOT EXISTS (SELECT 1 FROM pg_type AS e WHERE e.typarray = t.oid))
     + (SELECT count(*) FROM pg_proc AS p WHERE p.pronamespace = n.oid),
       EXISTS (SELECT 1 FROM pg_class AS c WHERE c.relnamespace = n.oid AND c.relname = 'gendurable_instances')
FROM (SELECT $1::text AS name) AS s
LEFT JOIN pg_namespace AS n ON n.nspname = s.name`

// InspectSchema reads whether schema exists, its comment, and what it holds.
func InspectSchema(ctx context.Context, db RowQuerier, schema string) (SchemaInfo, error) {
	var s SchemaInfo
	if err := ValidateSchema(schema); err != nil {
		return s, err
	}
	err := db.QueryRow(ctx, schemaInfoSQL, schema).Scan(&s.Exists, &s.Comment, &s.Objects, &s.Gendurable)
	return s, err
}

// CreateScratchSchema creates schema, marked as a scratch schema of owner
// (a lower-case word: "demo", "bench"). It fails if the schema exists.
func CreateScratchSchema(ctx context.Context, db DB, schema, owner string) error {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	if !scratchOwnerRE.MatchString(owner) {
		return fmt.Errorf("scratch schema owner %q: want lower-case letters", owner)
	}
	// COMMENT takes no parameters: the literal is built from a validated word.
	_, err := db.Exec(ctx, "CREATE SCHEMA "+quoteIdent(schema)+"; COMMENT ON SCHEMA "+quoteIdent(schema)+
		" IS '"+scratchCommentPrefix+" (created by gendurable "+owner+"; dropped by it without asking)'")
	return err
}

// DropSchema drops schema and everything in it. Callers decide whether it
// is theirs to drop (SchemaInfo.Scratch, or the operator's explicit reset).
func DropSchema(ctx context.Context, db DB, schema string) error {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	_, err := db.Exec(ctx, "DROP SCHEMA IF EXISTS "+quoteIdent(schema)+" CASCADE")
	return err
}

// DropEmptySchema drops schema without CASCADE: it fails (SQLSTATE 2BP01)
// if anything is left in it.
func DropEmptySchema(ctx context.Context, db DB, schema string) error {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	_, err := db.Exec(ctx, "DROP SCHEMA "+quoteIdent(schema)+" RESTRICT")
	return err
}

// ForeignRows reports, inside tx, what a scratch schema holds that its
// command did not put there: instances (or registered definitions) of a
// machine not in machines, and queue rows (a queue row is written only by
// an operator's pause or resume). "" means nothing foreign. It looks twice:
// first without a lock, so that a schema someone else's workers use is
// refused without holding them up; then, if nothing was found, with each
// table locked against writes until tx ends (waiting at most 5 s for a
// lock: SQLSTATE 55P03 then), so that nothing is added between the look
// and a drop in the same transaction. Tables an older schema version does
// not have are skipped.
func ForeignRows(ctx context.Context, tx DB, schema string, machines []string) (string, error) {
	if err := ValidateSchema(schema); err != nil {
		return "", err
	}
	if machines == nil {
		machines = []string{} // NULL would make every comparison unknown
	}
	s := quoteIdent(schema)
	all := []struct{ table, col, foreign, what string }{
		{"gendurable_instances", "fsm", "fsm <> ALL($1::text[])", "instances of machines it does not run"},
		{"gendurable_machines", "name", "name <> ALL($1::text[])", "definitions of machines it does not run"},
		{"gendurable_queues", "name", "$1::text[] IS NOT NULL", "queue rows (written by an operator's pause)"},
	}
	tables := all[:0]
	for _, t := range all {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s+"."+t.table).Scan(&exists); err != nil {
			return "", err
		}
		if exists {
			tables = append(tables, t)
		}
	}
	for _, lock := range []bool{false, true} {
		if lock {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
				return "", err
			}
		}
		var parts []string
		for _, t := range tables {
			if lock {
				if _, err := tx.Exec(ctx, "LOCK TABLE "+s+"."+t.table+" IN SHARE ROW EXCLUSIVE MODE"); err != nil {
					return "", err
				}
			}
			var n int64
			var first string
			// Counted up to 1,000: enough to say what is there.
			err := tx.QueryRow(ctx, `SELECT count(*), coalesce(min(x), '') FROM (SELECT `+t.col+`::text AS x FROM `+
				s+"."+t.table+` WHERE `+t.foreign+` LIMIT 1000) AS f`, machines).Scan(&n, &first)
			if err != nil {
				return "", err
			}
			if n > 0 {
				more := ""
				if n == 1000 {
					more = " or more"
				}
				parts = append(parts, fmt.Sprintf("%d%s %s (%q among them)", n, more, t.what, first))
			}
		}
		if len(parts) > 0 {
			return strings.Join(parts, ", "), nil
		}
	}
	return "", nil
}
