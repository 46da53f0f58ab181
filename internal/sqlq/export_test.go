package sqlq

// PickSQL exposes the rendered pick statement to the plan tests.
func (q *Queries) PickSQL() string { return q.pick }

// ReapSQL exposes the rendered reap statement to the plan tests.
func (q *Queries) ReapSQL() string { return q.reap }

// ApplyOutcomesSQL exposes the rendered outcome statement to the plan tests.
func (q *Queries) ApplyOutcomesSQL() string { return q.applyOutcomes }
