package sqlq

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
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

// Creator is the command a scratch schema's mark names ("demo", "bench",
// "quickstart"), or "" if the mark names none (or there is no mark).
func (s SchemaInfo) Creator() string {
	if !s.Scratch() {
		return ""
	}
	_, rest, ok := strings.Cut(s.Comment, "(created by gendurable ")
	if !ok {
		return ""
	}
	owner, _, ok := strings.Cut(rest, ";")
	if !ok || !scratchOwnerRE.MatchString(owner) {
		return ""
	}
	return owner
}

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

// foreignObjectsSQL counts, and describes the first $2 of, the objects in
// schema $1 whose names do not start with gendurable_ (every object
// gendurable's migrations create does): relations, types other than row
// and array types, functions, operators, collations, conversions, operator
// classes and families, text search objects, extended statistics and
// extensions. An index of one of gendurable's tables is not counted,
// whatever its name: it goes with its table; nor are an extension's
// members (the extension is).
var foreignObjectsSQL = `
WITH n AS (SELECT oid FROM pg_namespace WHERE nspname = $1),
o AS (
  SELECT 'pg_class'::regclass AS cls, x.oid, x.relname::text AS name FROM pg_class AS x, n WHERE x.relnamespace = n.oid
    -- an index of gendurable's table goes with it: not counted
    AND NOT EXISTS (SELECT 1 FROM pg_index AS i JOIN pg_class AS t ON t.oid = i.indrelid
                    WHERE i.indexrelid = x.oid AND left(t.relname, 11) = 'gendurable_')
  UNION ALL SELECT 'pg_type'::regclass, x.oid, x.typname::text FROM pg_type AS x, n WHERE x.typnamespace = n.oid
    AND x.typrelid = 0 AND NOT EXISTS (SELECT 1 FROM pg_type AS e WHERE e.typarray = x.oid)
` + foreignCatalogs() + `)
SELECT count(*), coalesce((array_agg(pg_describe_object(cls, oid, 0) ORDER BY cls::oid, name))[1:$2], '{}')
FROM o WHERE left(name, 11) <> 'gendurable_'
  -- an extension's members: the extension is named instead
  AND NOT EXISTS (SELECT 1 FROM pg_depend AS d WHERE d.classid = o.cls AND d.objid = o.oid AND d.deptype = 'e')`

// foreignCatalogs is foreignObjectsSQL's branches for the catalogs whose
// columns are named alike: prefix+"name", prefix+"namespace".
func foreignCatalogs() string {
	var b strings.Builder
	for _, c := range [][2]string{{"pg_proc", "pro"}, {"pg_operator", "opr"}, {"pg_collation", "coll"}, {"pg_conversion", "con"},
		{"pg_opclass", "opc"}, {"pg_opfamily", "opf"}, {"pg_ts_config", "cfg"}, {"pg_ts_dict", "dict"}, {"pg_ts_parser", "prs"},
		{"pg_ts_template", "tmpl"}, {"pg_statistic_ext", "stx"}, {"pg_extension", "ext"}} {
		fmt.Fprintf(&b, "  UNION ALL SELECT '%[1]s'::regclass, x.oid, x.%[2]sname::text FROM %[1]s AS x, n WHERE x.%[2]snamespace = n.oid\n", c[0], c[1])
	}
	return b.String()
}

// ForeignObjects reports the objects in schema that are not gendurable's by
// name (foreignObjectsSQL): how many, and the first limit of them, named
// as PostgreSQL describes them ("table public.orders"). An object someone
// named gendurable_… is not among them: the comparison with a fresh
// install (internal/scratch's additions) refuses it, and so would the
// drop without CASCADE that leaves no room for it (migrate's down, then
// DropEmptySchema) — but not an object that depends on gendurable's
// automatically (a sequence owned by one of its columns, statistics on
// it), which that drop takes along.
func ForeignObjects(ctx context.Context, db RowQuerier, schema string, limit int) (int64, []string, error) {
	if err := ValidateSchema(schema); err != nil {
		return 0, nil, err
	}
	var n int64
	var names []string
	err := db.QueryRow(ctx, foreignObjectsSQL, schema, limit).Scan(&n, &names)
	return n, names, err
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
// machine not in machines, and paused queues (a queue row is written only
// by an operator's pause or resume; a resumed one holds nothing). "" means nothing foreign. It looks twice:
// first without a lock, so that a schema someone else's workers use is
// refused without holding them up; then, if nothing was found, with every
// table of the schema locked until tx ends (LockSchemaTables), so that
// nothing is added or changed between the look and a drop in the same
// transaction. Tables an older schema version does
// not have are skipped.
func ForeignRows(ctx context.Context, tx DB, schema string, machines []string) (string, error) {
	if err := ValidateSchema(schema); err != nil {
		return "", err
	}
	if machines == nil {
		machines = []string{} // NULL would make every comparison unknown
	}
	s := quoteIdent(schema)
	all := []struct{ table, col, foreign, what, one string }{
		{"gendurable_instances", "fsm", "fsm <> ALL($1::text[])", "instances of machines this program does not run", "instance of a machine this program does not run"},
		{"gendurable_machines", "name", "name <> ALL($1::text[])", "definitions of machines this program does not run", "definition of a machine this program does not run"},
		// A resumed queue's row (paused false) holds nothing but its name
		// and the time of the resume: a newcomer who paused and resumed the
		// demo's queue could run the demo again only with --reset-schema.
		{"gendurable_queues", "name", "paused AND $1::text[] IS NOT NULL", "paused queues (an operator's pause)", "paused queue (an operator's pause)"},
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
			// Every table of the schema, not only these: what they are
			// made of must not change before the drop either (the
			// caller's comparison, then the drop, in tx).
			if err := LockSchemaTables(ctx, tx, schema); err != nil {
				return "", err
			}
		}
		var parts []string
		for _, t := range tables {
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
				if n == 1 {
					parts = append(parts, fmt.Sprintf("1 %s (%q)", t.one, first))
				} else {
					parts = append(parts, fmt.Sprintf("%d%s %s (%q among them)", n, more, t.what, first))
				}
			}
		}
		if len(parts) > 0 {
			return strings.Join(parts, ", "), nil
		}
	}
	return "", nil
}

// schemaShapeSQL lists what a schema's objects are made of, one line each,
// with the schema's name taken out of every definition (a quoted form, $2,
// and a bare one, $3 as a regular expression, only where no letter, digit
// or underscore comes before it; in a function's source, the quoted form
// alone: a second demo in a schema named "rs" found its own functions
// changed, "p_cursor" read as "p_cu{{schema}}or" — a hostile operator's
// probe), so that two schemas migrated to the same version list
// the same lines: the relations (their options, grants and comments), their
// columns (types, defaults, grants, comments), constraints, index
// definitions, triggers, policies, rules and row-level security, the
// extended statistics and publications on them, the schema's types (an
// enum's labels) and functions (their source and settings), and the
// schema's default privileges. Dropping them drops all of these without a
// word (DROP … RESTRICT refuses only for objects that depend on them in
// their own right: a view, a foreign key elsewhere).
const schemaShapeSQL = `
WITH n AS (SELECT oid FROM pg_namespace WHERE nspname = $1),
rels AS (SELECT c.oid, c.relname, c.relkind, c.relrowsecurity, c.relforcerowsecurity, c.reloptions,
                -- the owner's default privileges written out (a grant revoked) are none
                CASE WHEN c.relacl = acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char", c.relowner)
                     THEN NULL ELSE c.relacl END AS relacl
         FROM pg_class AS c, n WHERE c.relnamespace = n.oid)
SELECT coalesce(array_agg(regexp_replace(replace(x, $2, ''), '(^|[^A-Za-z0-9_])' || $3, '\1', 'g') ORDER BY x), '{}') FROM (
  SELECT 'relation ' || r.relname || ' (' || r.relkind::text || ')'
         || coalesce(' with ' || array_to_string(r.reloptions, ','), '')
         || coalesce(' granted ' || r.relacl::text, '')
         || coalesce(' comment ' || obj_description(r.oid, 'pg_class'), '')
  FROM rels AS r
  UNION ALL
  SELECT 'column ' || r.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
         || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
         || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
         || coalesce(' granted ' || nullif(a.attacl, '{}')::text, '')
         || coalesce(' comment ' || col_description(r.oid, a.attnum), '')
  FROM rels AS r JOIN pg_attribute AS a ON a.attrelid = r.oid
  LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  WHERE a.attnum > 0 AND NOT a.attisdropped AND r.relkind IN ('r', 'p', 'v', 'm', 'f')
  UNION ALL
  SELECT 'constraint ' || r.relname || '.' || co.conname || ' ' || pg_get_constraintdef(co.oid)
  FROM rels AS r JOIN pg_constraint AS co ON co.conrelid = r.oid
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(r.oid) FROM rels AS r WHERE r.relkind IN ('i', 'I')
  UNION ALL
  SELECT 'trigger ' || r.relname || '.' || t.tgname FROM rels AS r JOIN pg_trigger AS t ON t.tgrelid = r.oid WHERE NOT t.tgisinternal
  UNION ALL
  SELECT 'policy ' || r.relname || '.' || p.polname FROM rels AS r JOIN pg_policy AS p ON p.polrelid = r.oid
  UNION ALL
  SELECT 'rule ' || r.relname || '.' || w.rulename FROM rels AS r JOIN pg_rewrite AS w ON w.ev_class = r.oid WHERE w.rulename <> '_RETURN'
  UNION ALL
  SELECT 'row-level security on ' || r.relname FROM rels AS r WHERE r.relrowsecurity OR r.relforcerowsecurity
  UNION ALL
  SELECT 'statistics ' || CASE WHEN s.stxnamespace = (SELECT oid FROM n) THEN '' ELSE s.stxnamespace::regnamespace::text || '.' END
         || s.stxname || ' on ' || r.relname
  FROM rels AS r JOIN pg_statistic_ext AS s ON s.stxrelid = r.oid
  UNION ALL
  SELECT 'publication ' || p.pubname || ' of ' || r.relname
  FROM rels AS r JOIN pg_publication_rel AS pr ON pr.prrelid = r.oid JOIN pg_publication AS p ON p.oid = pr.prpubid
  UNION ALL
  SELECT 'type ' || t.typname || ' (' || t.typtype::text || ')'
         || coalesce(' labels ' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum AS e WHERE e.enumtypid = t.oid), '')
  FROM pg_type AS t, n WHERE t.typnamespace = n.oid AND t.typtype IN ('e', 'd', 'b', 'r', 'm') AND t.typelem = 0
  UNION ALL
  SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') '
         || md5(replace(p.prosrc, '"' || $1 || '"', '{{schema}}'))
         || coalesce(' set ' || array_to_string(p.proconfig, ','), '')
  FROM pg_proc AS p, n WHERE p.pronamespace = n.oid
  UNION ALL
  SELECT 'default privileges ' || da.defaclobjtype::text || ' ' || da.defaclacl::text
  FROM pg_default_acl AS da, n WHERE da.defaclnamespace = n.oid
) AS s(x)`

// schemaPublishedSQL: publications of every table in the schema (FOR
// TABLES IN SCHEMA, PostgreSQL 15 on: pg_publication_namespace).
const schemaPublishedSQL = `
SELECT coalesce(array_agg('publication ' || p.pubname || ' of the schema' ORDER BY p.pubname), '{}')
FROM pg_publication_namespace AS pn JOIN pg_publication AS p ON p.oid = pn.pnpubid
JOIN pg_namespace AS n ON n.oid = pn.pnnspid WHERE n.nspname = $1`

// SchemaShape lists what schema's objects are made of (schemaShapeSQL),
// sorted: what a schema migrated to the same version lists too, and what
// someone added to them besides. db is a transaction: JIT is turned off
// for the rest of it.
func SchemaShape(ctx context.Context, db RowQuerier, schema string) ([]string, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	// Without JIT for the rest of the caller's transaction (db is one):
	// the planner's estimate of this catalog query passes jit_above_cost,
	// and the statement took 0.8 s with JIT (EXPLAIN: 161 functions
	// compiled) and 0.05 s after SET jit = off (psql, a schema at version
	// 22); the demo's re-run reads the shape twice.
	var prev string
	if err := db.QueryRow(ctx, `SELECT set_config('jit', 'off', true)`).Scan(&prev); err != nil {
		return nil, err
	}
	var shape []string
	if err := db.QueryRow(ctx, schemaShapeSQL, schema, quoteIdent(schema)+".", schema+`\.`).Scan(&shape); err != nil {
		return nil, err
	}
	var has bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_publication_namespace') IS NOT NULL`).Scan(&has); err != nil || !has {
		return shape, err
	}
	var published []string
	if err := db.QueryRow(ctx, schemaPublishedSQL, schema).Scan(&published); err != nil {
		return nil, err
	}
	return append(shape, published...), nil
}

// A scratch schema in use: every process of a scratch command that works
// in it (the demo, the quickstart's workers) holds a shared session-level
// advisory lock of the schema (HoldScratch) on a connection of its own; a
// drop takes the same lock exclusively in its transaction, without
// waiting (ScratchHeld), and gives up at once if anyone holds it — before
// it locks a table, so a running demo is neither held up nor chosen as a
// deadlock's victim. The key is the schema's name, hashed in a namespace
// of its own ("gendurable/scratch": no schema's pick lock, keyed by
// 'gendurable:' || its name, can have it).
const scratchKey = `hashtext('gendurable/scratch'), hashtext($1)`

// HoldScratch takes the shared advisory lock of schema's use on conn, for
// the session: false if a drop holds it (the schema is being dropped and
// created again by another run).
func HoldScratch(ctx context.Context, conn RowQuerier, schema string) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock_shared(`+scratchKey+`)`, schema).Scan(&ok)
	return ok, err
}

// UnholdScratch lets go of schema's use taken by HoldScratch on conn.
func UnholdScratch(ctx context.Context, conn RowQuerier, schema string) error {
	var ok bool
	return conn.QueryRow(ctx, `SELECT pg_advisory_unlock_shared(`+scratchKey+`)`, schema).Scan(&ok)
}

// ScratchHeld reports, inside the drop's transaction tx, whether another
// session holds schema's use (HoldScratch); when it does not, tx now holds
// the lock exclusively until it ends, and no run can start using the
// schema before the drop commits.
func ScratchHeld(ctx context.Context, tx RowQuerier, schema string) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(`+scratchKey+`)`, schema).Scan(&ok)
	return !ok, err
}

// LiveClaims is how many instances in schema's gendurable_instances (0 if
// it has none) are executing under a lease that has not run out on the
// database's clock: a worker is running them, or was until moments ago.
func LiveClaims(ctx context.Context, db RowQuerier, schema string) (int64, error) {
	if err := ValidateSchema(schema); err != nil {
		return 0, err
	}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`,
		quoteIdent(schema)+".gendurable_instances").Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var n int64
	err := db.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(schema)+`.gendurable_instances
		WHERE status::text = 'executing' AND lease_expires_at > now()`).Scan(&n)
	return n, err
}

// LockSchemaTables locks every table of schema against writes and changes
// of its definition (SHARE ROW EXCLUSIVE) until tx ends, waiting at most
// 5 s for each lock (SQLSTATE 55P03 then): what the tables are made of
// cannot change between a look at it and a drop in the same transaction.
func LockSchemaTables(ctx context.Context, tx DB, schema string) error {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') ORDER BY c.relname`, schema)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, name := range names {
		// A name someone else chose: quoted with its quotes doubled.
		if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, name}.Sanitize()+" IN SHARE ROW EXCLUSIVE MODE"); err != nil {
			return err
		}
	}
	return nil
}
