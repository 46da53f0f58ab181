package sqlq

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// ---------------------------------------------------------------------------
// Insert (docs/design.md §3): many rows in one statement from column arrays. A missing
// run-at falls back to now() + run-in on the database clock. A row whose
// unique key collides with a live row in its scope (or with an earlier row of
// the same batch) is skipped by ON CONFLICT, which must repeat the unique
// index's predicate exactly to infer it.

const insertManySQL = insertRowsSQL + insertKeyedTailSQL

// insertRowsSQL inserts the rows of the column arrays $1–$13, numbered in
// their order (n.ord); insertKeyedTailSQL ends it for rows with unique keys.
const insertRowsSQL = `
INSERT INTO {{schema}}.gendurable_instances (` + newRowColumns + `)
SELECT ` + newRowSelect + `
FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::text[], $6::smallint[], $7::int[],
            $8::timestamptz[], $9::bigint[], $10::text[], $11::bytea[], $12::int[], $13::int[])
     WITH ORDINALITY AS n(fsm, fsm_version, queue, step, state, priority, max_attempts, run_at,
                          run_in_us, partition_key, unique_key, scope_mask, key_limit, ord)`

// Rows with unique keys go in in the order of their keys (then the input's,
// so the first of two rows of one key is the one inserted), rows without
// after them in the input's: a row whose key another statement has just
// inserted waits for that statement's transaction, and two batches of
// overlapping keys in opposite orders each waited for the other (a probe:
// 19 of 20 rounds of two such InsertMany calls failed with a deadlock).
// Ordered by key, the one that meets the other's row first holds none the
// other wants after it. Ids follow that order, not the input's: no order
// among a statement's rows rests on their ids (keyed rows of one partition
// key are spaced by their eligible_at, newRows.add).
const insertKeyedTailSQL = `
ORDER BY n.unique_key, n.ord
ON CONFLICT (unique_guard) WHERE unique_guard IS NOT NULL DO NOTHING
RETURNING id, unique_key`

// insertSlotSQL is insertManySQL for a batch holding a periodic slot's row
// (NewInstance.Slot): a slot's row is inserted only while no row of a
// later slot of its schedule whose time has come is in the table
// (laterDueSlotSQL). A prune keeps each schedule's newest such row
// (newestSlotSQL), so once a slot's own row may have been pruned a later
// one is there: an insert of the slot that reaches the database that late
// — sent on a connection that was cut off, given up by its engine and
// retried elsewhere, then healed, the server running the bytes still in
// flight — does nothing, where it ran the slot a second time. A schedule's
// slots are inserted in their order: an older one is not inserted once a
// later one's is, unless that one is early (inserted by a process whose
// clock is ahead, before its time).
var insertSlotSQL = insertRowsSQL + `
WHERE NOT (` + slotKeySQL("n.unique_key") + ` AND ` + laterDueSlotSQL("n.unique_key") + `)` + insertKeyedTailSQL

// insertPlainSQL is insertManySQL for a batch without unique keys: no
// conflict arbitration (speculative insertion costs per row) and no key to
// return.
const insertPlainSQL = `
INSERT INTO {{schema}}.gendurable_instances (` + newRowColumns + `)
SELECT ` + newRowSelect + `
FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::text[], $6::smallint[], $7::int[],
            $8::timestamptz[], $9::bigint[], $10::text[], $11::bytea[], $12::int[], $13::int[])
     AS n(fsm, fsm_version, queue, step, state, priority, max_attempts, run_at,
          run_in_us, partition_key, unique_key, scope_mask, key_limit)
RETURNING id, unique_key`

// lookupUniqueSQL finds the live rows holding unique keys (after a skip).
const lookupUniqueSQL = `
SELECT unique_guard, id FROM {{schema}}.gendurable_instances
WHERE unique_guard = ANY($1::bytea[]) AND unique_guard IS NOT NULL`

// NewInstance is one row to insert.
type NewInstance struct {
	FSM          string
	Version      int32
	Queue        string
	Step         string
	State        string // JSON
	Priority     int16
	MaxAttempts  int32
	RunAt        *time.Time
	RunIn        time.Duration
	PartitionKey *string
	KeyLimit     *int32 // nil: the key's policy
	UniqueKey    []byte // nil: no uniqueness
	ScopeMask    int32  // bit k-1 set: status number k (enum order) is in the unique scope
	// Slot: a periodic slot's row (UniqueKey a slot's key), inserted only
	// while no row of a later slot of its schedule is in the table
	// (insertSlotSQL); skipped, it is reported as a Duplicate.
	Slot bool
}

// newRows is a set of NewInstance as column arrays.
type newRows struct {
	fsm, queue, step, state []string
	version, maxAttempts    []int32
	priority                []int16
	runAt                   []*time.Time
	runIn                   []int64
	partition               []*string
	uniqueKey               [][]byte
	scopeMask               []int32
	keyLimit                []*int32
	// ofKey counts the rows of each partition key added so far: the nth
	// row of a key is made eligible n-1 microseconds after its time (its
	// RunAt, or the statement's clock plus its RunIn: newRowSelect), so
	// rows of one key that would tie on (priority, eligible_at) — one
	// statement reads its clock once — run in the order they were given,
	// not in the order the table happens to store them (docs/design.md §6;
	// Engine.wake kicks a RunAt at the same spacing).
	ofKey map[string]int64
}

func (c *newRows) reset() {
	clear(c.ofKey)
	c.fsm, c.queue, c.step, c.state = c.fsm[:0], c.queue[:0], c.step[:0], c.state[:0]
	c.version, c.maxAttempts, c.priority = c.version[:0], c.maxAttempts[:0], c.priority[:0]
	c.runAt, c.runIn, c.partition = c.runAt[:0], c.runIn[:0], c.partition[:0]
	c.uniqueKey, c.scopeMask, c.keyLimit = c.uniqueKey[:0], c.scopeMask[:0], c.keyLimit[:0]
}

func (c *newRows) add(r *NewInstance) {
	c.fsm = append(c.fsm, r.FSM)
	c.version = append(c.version, r.Version)
	c.queue = append(c.queue, r.Queue)
	c.step = append(c.step, r.Step)
	c.state = append(c.state, r.State)
	c.priority = append(c.priority, r.Priority)
	c.maxAttempts = append(c.maxAttempts, r.MaxAttempts)
	runAt, runIn := r.RunAt, micros(r.RunIn)
	if r.PartitionKey != nil {
		if c.ofKey == nil {
			c.ofKey = make(map[string]int64)
		}
		n := c.ofKey[*r.PartitionKey]
		c.ofKey[*r.PartitionKey] = n + 1
		if n > 0 && runAt != nil {
			t := runAt.Add(time.Duration(n) * time.Microsecond)
			runAt = &t
		} else if n > 0 {
			runIn += n
		}
	}
	c.runAt = append(c.runAt, runAt)
	c.runIn = append(c.runIn, runIn)
	c.partition = append(c.partition, r.PartitionKey)
	c.uniqueKey = append(c.uniqueKey, r.UniqueKey)
	c.scopeMask = append(c.scopeMask, r.ScopeMask)
	c.keyLimit = append(c.keyLimit, r.KeyLimit)
}

// Inserted is the answer for one input row of InsertMany.
type Inserted struct {
	ID        int64
	Duplicate bool // the unique key was held: ID is the holder's
}

// InsertMany inserts the rows in one statement and returns, in input order,
// each row's id or, for a unique-key duplicate, the id of the row holding the
// key (found with a second statement, run only when something was skipped).
func (q *Queries) InsertMany(ctx context.Context, db DB, in []NewInstance) ([]Inserted, error) {
	var c newRows
	for i := range in {
		c.add(&in[i])
	}
	stmt := q.insertPlain
	for i, k := range c.uniqueKey {
		if in[i].Slot {
			stmt = q.insertSlot
			break
		}
		if k != nil {
			stmt = q.insertMany
		}
	}
	rows, err := db.Query(ctx, stmt, c.fsm, c.version, c.queue, c.step, c.state, c.priority,
		c.maxAttempts, c.runAt, c.runIn, c.partition, c.uniqueKey, c.scopeMask, c.keyLimit)
	if err != nil {
		return nil, err
	}
	type ret struct {
		id  int64
		key []byte
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ret, error) {
		var r ret
		err := row.Scan(&r.id, &r.key)
		return r, err
	})
	if err != nil {
		return nil, err
	}
	// Rows come back in the order they were inserted (insertKeyedTailSQL:
	// those with unique keys by key, the others in input order after them);
	// skipped ones are absent. A key's row is its first input row's.
	out := make([]Inserted, len(in))
	var missing [][]byte
	byKey := map[string]int64{}
	j := 0
	for ; j < len(got) && got[j].key != nil; j++ {
		byKey[string(got[j].key)] = got[j].id
	}
	for i := range in {
		if in[i].UniqueKey == nil {
			if j < len(got) {
				out[i].ID = got[j].id
				j++
			}
			continue
		}
		if id, ok := byKey[string(in[i].UniqueKey)]; ok {
			out[i].ID = id
			delete(byKey, string(in[i].UniqueKey)) // a later row of the key is a duplicate of this one
			continue
		}
		out[i].Duplicate = true
		missing = append(missing, in[i].UniqueKey)
	}
	if len(missing) == 0 {
		return out, nil
	}
	// A new statement, so a new snapshot: it sees holders committed meanwhile.
	// The insert has returned: outside a transaction its rows are committed,
	// so a caller whose context ends now must still learn their ids — the
	// lookup is not cancelled with it, and if it fails the duplicates keep
	// ID 0 and the error comes back as a LookupError beside the results.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
	defer cancel()
	holders, err := q.lookupHolders(lctx, db, missing)
	for i := range in {
		if out[i].Duplicate {
			out[i].ID = holders[string(in[i].UniqueKey)] // 0 if the holder left its scope meanwhile
		}
	}
	if err != nil {
		return out, &LookupError{Err: err}
	}
	return out, nil
}

// lookupTimeout bounds InsertMany's read of its duplicates' holders.
const lookupTimeout = 5 * time.Second

// LookupError is InsertMany's failure to read the ids of the instances
// holding its duplicates' unique keys, after the insert statement returned:
// the results come with it, the duplicates' IDs 0.
type LookupError struct{ Err error }

func (e *LookupError) Error() string {
	return "reading the holders of duplicate unique keys: " + e.Err.Error()
}
func (e *LookupError) Unwrap() error { return e.Err }

// lookupHolders maps unique keys to the ids of the instances holding them.
func (q *Queries) lookupHolders(ctx context.Context, db DB, keys [][]byte) (map[string]int64, error) {
	rows, err := db.Query(ctx, q.lookupUnique, keys)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	holders := map[string]int64{}
	for rows.Next() {
		var key []byte
		var id int64
		if err := rows.Scan(&key, &id); err != nil {
			return nil, err
		}
		holders[string(key)] = id
	}
	return holders, rows.Err()
}
