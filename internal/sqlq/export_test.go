package sqlq

// PickSQL exposes the rendered pick statement to the plan tests.
func (q *Queries) PickSQL() string { return q.pick }

// PruneLockSQL exposes the rendered first statement of a prune batch to the
// plan tests.
func (q *Queries) PruneLockSQL() string { return q.pruneLock }

// ReapSQL exposes the rendered reap statement to the plan tests.
func (q *Queries) ReapSQL() string { return q.reap }

// OutcomeStatement exposes the outcome statement a batch runs, with its
// arguments, to the plan tests.
func (q *Queries) OutcomeStatement(b *OutcomeBatch) (string, []any) { return q.outcomeStatement(b) }

// IdleLimitSettings exposes the first statements of the library's own
// transactions that set their idle limit, for admin_test.go.
var IdleLimitSettings = map[string]string{"prune": pruneSettings, "throughput": throughputSettings,
	"migrate": migrateLock}

// BeginRetry is the BEGIN of Retry's and RetryMany's transactions.
var BeginRetry = BeginIdleLimited(ownTxIdle)
