package gendurable

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gendurable/gendurable/internal/sqlq"
)

// Partition keys (docs/design.md §6). An instance inserted with
// [InsertOpts].PartitionKey holds a slot of its key while it runs a step:
// the executing row itself is the slot, stamped with its claim's fencing
// token ([Run].Token) and lease. The pick takes a slot only when the key has
// one free — fewer live holders than its limit, counted under a
// transaction-level lock of the key — so at most the limit of a key's
// instances run a step at once, across every process. A slot is freed when
// its outcome commits, or when its lease runs out on the database clock; a
// heartbeat never extends a keyed lease that ran out, and a step whose
// lease cannot be confirmed in time is cancelled. Nothing is held between
// statements, so keys work behind a transaction-pooling proxy.

// KeyPolicy is how many instances of the partition keys starting with
// Prefix may run a step at once, and how often one may start, across every
// process (see [Config.KeyPolicies]). An empty Prefix matches every key.
type KeyPolicy struct {
	Prefix string
	// Limit is how many instances of one key run a step at once. Required:
	// 1 to 1<<20 (1048576).
	Limit int
	// Rate, if not 0, is how many steps of one key may start per Per: a
	// token bucket per key, refilled at Rate/Per, holding at most Burst
	// starts, kept in the database so every process draws from it.
	Rate int
	// Per is Rate's interval, at least 1ms. Default (with a Rate) 1s.
	Per time.Duration
	// Burst is how many starts a key that was idle may make at once.
	// Default (with a Rate) Rate: one interval's worth. At most 1<<20.
	Burst int
}

// validKeyPolicies checks policies and returns a copy the caller cannot
// change behind the engine's back.
func validKeyPolicies(policies []KeyPolicy) ([]KeyPolicy, error) {
	prefixes := map[string]bool{}
	policies = slices.Clone(policies)
	for i := range policies {
		p := &policies[i]
		burstSet := p.Burst != 0
		if p.Rate > 0 {
			setDefault(&p.Per, time.Second)
			setDefault(&p.Burst, p.Rate)
		}
		switch {
		case p.Limit <= 0 || p.Limit > maxKeyLimit:
			return nil, errorf(ErrInvalidConfig, "KeyPolicy %s: Limit %d outside 1..%d", quoted(p.Prefix), p.Limit, maxKeyLimit)
		case p.Rate < 0 || p.Per < 0 || p.Burst < 0:
			return nil, errorf(ErrInvalidConfig, "KeyPolicy %s: negative Rate, Per or Burst", quoted(p.Prefix))
		case p.Rate == 0 && (p.Per != 0 || p.Burst != 0):
			return nil, errorf(ErrInvalidConfig, "KeyPolicy %s: Per or Burst without a Rate", quoted(p.Prefix))
		case p.Rate > 0 && p.Per < time.Millisecond:
			return nil, errorf(ErrInvalidConfig, "KeyPolicy %s: Per %s below 1ms", quoted(p.Prefix), p.Per)
		case p.Burst > maxKeyLimit && !burstSet:
			// Named as the caller wrote it: Burst was never set.
			return nil, errorf(ErrInvalidConfig, "KeyPolicy %s: Rate %d above %d with no Burst (an unset Burst is the Rate): set a Burst of at most %d",
				quoted(p.Prefix), p.Rate, maxKeyLimit, maxKeyLimit)
		case p.Burst > maxKeyLimit:
			return nil, errorf(ErrInvalidConfig, "KeyPolicy %s: Burst %d above %d", quoted(p.Prefix), p.Burst, maxKeyLimit)
		case prefixProblem(p.Prefix) != "":
			return nil, errorf(ErrInvalidConfig, "KeyPolicy prefix %s %s", quoted(p.Prefix), prefixProblem(p.Prefix))
		case prefixes[p.Prefix]:
			return nil, errorf(ErrInvalidConfig, "two KeyPolicies with prefix %s", quoted(p.Prefix))
		}
		prefixes[p.Prefix] = true
	}
	return policies, nil
}

// pickPolicies is policies as the pick takes them.
func pickPolicies(policies []KeyPolicy) []sqlq.KeyPolicy {
	out := make([]sqlq.KeyPolicy, len(policies))
	for i, p := range policies {
		out[i] = sqlq.KeyPolicy{Prefix: p.Prefix, Limit: p.Limit, Burst: p.Burst}
		if p.Rate > 0 {
			out[i].Rate = float64(p.Rate) / p.Per.Seconds()
		}
	}
	return out
}

// keyLimit is how many slots key has as this engine sees it: the row's own
// KeyLimit, else the longest matching policy's, else 1 — what the pick does.
func (e *Engine) keyLimit(key string, own *int32) int {
	if own != nil {
		return int(*own)
	}
	if p := e.policy(key); p != nil {
		return p.Limit
	}
	return 1
}

// policy is the KeyPolicy of key in this engine (the longest matching
// prefix), or nil.
func (e *Engine) policy(key string) *KeyPolicy {
	var best *KeyPolicy
	for i := range e.cfg.KeyPolicies {
		p := &e.cfg.KeyPolicies[i]
		if strings.HasPrefix(key, p.Prefix) && (best == nil || len(p.Prefix) > len(best.Prefix)) {
			best = p
		}
	}
	return best
}

// keyRate is the start rate (per second) and burst of key's policy, as
// the pick's bucket counts them (pickPolicies); 0 if it has no rate.
func (e *Engine) keyRate(key string) (float64, int) {
	p := e.policy(key)
	if p == nil || p.Rate == 0 {
		return 0, 0
	}
	return float64(p.Rate) / p.Per.Seconds(), p.Burst
}

// maxWait bounds a rate limit's reported wait: a century, past any Per.
const maxWait = 100 * 365 * 24 * time.Hour

// rateLimitedUntil is when key's bucket (tokens as of refilled) has a
// start again, if that is after now and the key has a rate here.
func (e *Engine) rateLimitedUntil(key string, tokens float64, refilled, now time.Time) *time.Time {
	p := e.policy(key)
	if p == nil || p.Rate == 0 {
		return nil
	}
	// In float: Per near math.MaxInt64 overflowed a Duration (negative: a
	// wait in the past, so the limit went unreported).
	wait := (1 - tokens) * float64(p.Per) / float64(p.Rate)
	at := refilled.Add(time.Duration(min(wait, float64(maxWait))))
	if tokens >= 1 || !at.After(now) {
		return nil
	}
	return &at
}

// ratesKey reports whether this engine's KeyPolicies give key a rate.
func (e *Engine) ratesKey(key string) bool {
	p := e.policy(key)
	return p != nil && p.Rate > 0
}

// knowsKeyLimit reports whether this engine knows the limit of a key whose
// row has limit own (nil: its policy's) in queue: the row's own, or this
// engine's KeyPolicies — it has some, or it works the queue (its picks
// apply its policies, or 1).
func (e *Engine) knowsKeyLimit(own *int32, queue string) bool {
	if own != nil || len(e.cfg.KeyPolicies) > 0 {
		return true
	}
	_, works := e.cfg.Queues[queue]
	return works
}

// slots is "slot" or "slots" for n.
func slots(n int) string {
	if n == 1 {
		return "slot"
	}
	return "slots"
}

// instanceList names a few of ids, of total instances in all, for a
// sentence.
func instanceList(ids []int64, total int) string {
	const most = 3
	total = max(total, len(ids))
	var b strings.Builder
	b.WriteString("instance")
	if total > 1 {
		b.WriteString("s")
	}
	for i, id := range ids[:min(len(ids), most)] {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %d", id)
	}
	if total > min(len(ids), most) {
		fmt.Fprintf(&b, " and %d more", total-min(len(ids), most))
	}
	return b.String()
}
