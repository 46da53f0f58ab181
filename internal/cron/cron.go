// Package cron parses and evaluates cron schedules for periodic workflow
// instances.
//
// # Syntax
//
// A spec is an optional time-zone prefix followed by either five fields or a
// descriptor:
//
//	[TZ=Area/City | CRON_TZ=Area/City] minute hour day-of-month month day-of-week
//	[TZ=Area/City | CRON_TZ=Area/City] @descriptor
//	[TZ=Area/City | CRON_TZ=Area/City] @every <duration>
//
// Fields are separated by whitespace and have these ranges:
//
//	field         values
//	minute        0-59
//	hour          0-23
//	day-of-month  1-31
//	month         1-12 or JAN-DEC
//	day-of-week   0-7 or SUN-SAT (0 and 7 are both Sunday)
//
// Each field is a comma-separated list of elements; an element is one of
//
//	element meaning
//	*       every value of the field
//	a       a single value
//	a-b     the inclusive range a..b (a <= b)
//	*/n     every n-th value starting at the field minimum
//	a-b/n   every n-th value of a..b starting at a
//	a/n     shorthand for a-max/n
//
// Month and weekday names are three-letter English abbreviations and are
// case-insensitive; names are only accepted in their own field. Steps must be
// between 1 and the number of values of the field. For day-of-week, "*" and
// "a/n" cover 0-6 (7 is only an alias of 0 when written explicitly), and a
// range that ends with the name SUN, such as FRI-SUN, wraps to Sunday.
//
// Day-of-month and day-of-week follow Vixie cron: a field is "unrestricted"
// if it contains a "*" (so "*" and "*/2" both count as unrestricted). If both
// fields are restricted, a day matches when EITHER matches ("0 0 13 * FRI" runs
// on every 13th and on every Friday); otherwise both must match.
//
// Descriptors (case-insensitive):
//
//	@yearly, @annually   0 0 1 1 *
//	@monthly             0 0 1 * *
//	@weekly              0 0 * * 0
//	@daily, @midnight    0 0 * * *
//	@hourly              0 * * * *
//	@every <duration>    every <duration>, aligned to the Unix epoch
//
// The @every duration uses time.ParseDuration syntax ("90s", "1h30m") and must
// be between 1s and 5×365×24h. Its activations are the instants
// 1970-01-01T00:00:00Z + k×duration, so every process computes the same slot
// boundaries without coordination, independent of the time zone (the zone only
// determines the location of the returned times).
//
// Specs that can never fire because the day-of-month never occurs in any
// selected month (for example "0 0 30 2 *") are rejected. A spec is at most
// 256 bytes long.
//
// # Time zones and daylight saving
//
// Fields are matched against the wall clock of the schedule's location: UTC
// for Parse, the given location for ParseInLocation, or the zone named by a
// TZ=/CRON_TZ= prefix (loaded with time.LoadLocation; "Local" is rejected
// because it differs between processes). Activations are whole wall-clock
// minutes (seconds and nanoseconds are zero in the location). When a
// daylight-saving transition skips wall-clock times (a gap), activations that
// fall into the gap do not happen that day. When a transition repeats
// wall-clock times (an overlap), a repeated wall-clock time fires only at its
// first occurrence: in America/New_York on the day DST ends, "30 1 * * *"
// fires at 01:30 EDT only, and "0 * * * *" fires at 00:00 EDT, 01:00 EDT and
// then 02:00 EST (the second 01:00, in EST, is skipped).
package cron

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidSpec is wrapped by every error returned by Parse and
// ParseInLocation.
var ErrInvalidSpec = errors.New("cron: invalid spec")

// MaxSpecLen is the maximum accepted length of a spec, in bytes.
const MaxSpecLen = 256

// horizonYears bounds how far Next searches.
const horizonYears = 5

// maxEvery is the largest accepted @every duration: longer intervals could
// have no activation within the Next horizon.
const maxEvery = horizonYears * 365 * 24 * time.Hour

// Schedule computes activation times.
type Schedule interface {
	// Next returns the first activation time strictly after t (in the
	// schedule's location), or the zero time if none within 5 years.
	Next(t time.Time) time.Time
}

// Parse parses spec with UTC as the default location.
func Parse(spec string) (Schedule, error) {
	return ParseInLocation(spec, time.UTC)
}

// ParseInLocation parses spec with loc as the default location; a
// TZ=/CRON_TZ= prefix in spec overrides it. A nil loc means UTC.
func ParseInLocation(spec string, loc *time.Location) (Schedule, error) {
	if loc == nil {
		loc = time.UTC
	}
	if len(spec) > MaxSpecLen {
		return nil, invalid("spec too long (%d bytes, max %d)", len(spec), MaxSpecLen)
	}
	fields := strings.Fields(spec)
	if len(fields) == 0 {
		return nil, invalid("empty spec")
	}

	tzPrefix := ""
	if key, name, ok := cutTZ(fields[0]); ok {
		if name == "" {
			return nil, invalid("%s prefix has an empty time zone name", key)
		}
		if name == "Local" {
			return nil, invalid("%s prefix: time zone %q is not allowed (it differs between processes)", key, name)
		}
		l, err := time.LoadLocation(name)
		if err != nil {
			return nil, invalid("%s prefix: unknown time zone %q", key, name)
		}
		loc = l
		tzPrefix = "CRON_TZ=" + name + " "
		fields = fields[1:]
		if len(fields) == 0 {
			return nil, invalid("missing schedule after %s prefix", key)
		}
	}

	if strings.HasPrefix(fields[0], "@") {
		return parseDescriptor(fields, loc, tzPrefix)
	}
	if len(fields) != 5 {
		return nil, invalid("expected 5 fields (minute hour day-of-month month day-of-week), got %d", len(fields))
	}
	s := &cronSchedule{loc: loc}
	norm := make([]string, 5)
	for i, f := range fields {
		set, star, n, err := parseField(f, &fieldDefs[i])
		if err != nil {
			return nil, err
		}
		norm[i] = n
		switch i {
		case 0:
			s.minutes = set
		case 1:
			s.hours = set
		case 2:
			s.dom, s.domStar = set, star
		case 3:
			s.months = set
		case 4:
			s.dow, s.dowStar = set, star
		}
	}
	if !s.canFire() {
		return nil, invalid("day-of-month field %q never occurs in month field %q", fields[2], fields[3])
	}
	s.spec = tzPrefix + strings.Join(norm, " ")
	return s, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, args...))
}

func cutTZ(f string) (key, name string, ok bool) {
	for _, k := range []string{"CRON_TZ", "TZ"} {
		if rest, found := strings.CutPrefix(f, k+"="); found {
			return k, rest, true
		}
	}
	return "", "", false
}

var descriptors = map[string]struct{ canonical, expr string }{
	"@yearly":   {"@yearly", "0 0 1 1 *"},
	"@annually": {"@yearly", "0 0 1 1 *"},
	"@monthly":  {"@monthly", "0 0 1 * *"},
	"@weekly":   {"@weekly", "0 0 * * 0"},
	"@daily":    {"@daily", "0 0 * * *"},
	"@midnight": {"@daily", "0 0 * * *"},
	"@hourly":   {"@hourly", "0 * * * *"},
}

func parseDescriptor(fields []string, loc *time.Location, tzPrefix string) (Schedule, error) {
	name := strings.ToLower(fields[0])
	if name == "@every" {
		if len(fields) != 2 {
			return nil, invalid("@every takes exactly one duration argument, got %d", len(fields)-1)
		}
		d, err := time.ParseDuration(fields[1])
		if err != nil {
			return nil, invalid("@every duration %q: not a valid duration", fields[1])
		}
		if d < time.Second {
			return nil, invalid("@every duration %q: must be at least 1s", fields[1])
		}
		if d > maxEvery {
			return nil, invalid("@every duration %q: must be at most %s", fields[1], maxEvery)
		}
		return &everySchedule{every: d, loc: loc, spec: tzPrefix + "@every " + d.String()}, nil
	}
	desc, ok := descriptors[name]
	if !ok {
		return nil, invalid("unknown descriptor %q", fields[0])
	}
	if len(fields) != 1 {
		return nil, invalid("descriptor %s takes no arguments, got %d", fields[0], len(fields)-1)
	}
	s, err := ParseInLocation(desc.expr, loc)
	if err != nil { // cannot happen: the expressions are constant and valid
		return nil, err
	}
	cs := s.(*cronSchedule)
	cs.spec = tzPrefix + desc.canonical
	return cs, nil
}

// fieldDef describes one of the five fields.
type fieldDef struct {
	name     string
	min, max int      // accepted values
	starMax  int      // upper bound used by "*" and "a/n"
	names    []string // names[i] is the name of value i (if non-empty)
}

var (
	monthNames = []string{"", "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"}
	dowNames   = []string{"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"}
)

var fieldDefs = [5]fieldDef{
	{name: "minute", min: 0, max: 59, starMax: 59},
	{name: "hour", min: 0, max: 23, starMax: 23},
	{name: "day-of-month", min: 1, max: 31, starMax: 31},
	{name: "month", min: 1, max: 12, starMax: 12, names: monthNames},
	{name: "day-of-week", min: 0, max: 7, starMax: 6, names: dowNames},
}

func (fd *fieldDef) isDOW() bool { return fd.name == "day-of-week" }

// parseField parses one field into a bit set (bit v set = value v matches).
// star reports whether the field contains "*"; norm is the normalized text.
func parseField(f string, fd *fieldDef) (set uint64, star bool, norm string, err error) {
	bad := func(format string, args ...any) error {
		return invalid("%s field %q: %s", fd.name, f, fmt.Sprintf(format, args...))
	}
	elems := strings.Split(f, ",")
	for _, e := range elems {
		if e == "" {
			return 0, false, "", bad("empty list element")
		}
		rng, stepStr, hasStep := strings.Cut(e, "/")
		if hasStep && strings.Contains(stepStr, "/") {
			return 0, false, "", bad("more than one step in %q", e)
		}
		var lo, hi int
		endNamedSun := false
		switch {
		case rng == "*":
			star = true
			lo, hi = fd.min, fd.starMax
		case strings.Contains(rng, "-"):
			a, b, _ := strings.Cut(rng, "-")
			if lo, _, err = parseValue(a, fd, bad); err != nil {
				return 0, false, "", err
			}
			if hi, endNamedSun, err = parseValue(b, fd, bad); err != nil {
				return 0, false, "", err
			}
		default:
			if lo, _, err = parseValue(rng, fd, bad); err != nil {
				return 0, false, "", err
			}
			hi = lo
			if hasStep { // a/n means a-max/n
				hi = fd.starMax
				if lo > hi { // only possible for day-of-week 7/n
					hi = lo
				}
			}
		}
		if endNamedSun && lo > 0 {
			hi = 7 // FRI-SUN
		}
		if lo > hi {
			return 0, false, "", bad("range %q is reversed (%d > %d)", rng, lo, hi)
		}
		step := 1
		if hasStep {
			span := fd.max - fd.min + 1
			if fd.isDOW() {
				span = 7
			}
			if !isDigits(stepStr) {
				return 0, false, "", bad("step %q is not a positive integer", stepStr)
			}
			step, err = strconv.Atoi(stepStr)
			if err != nil || step < 1 || step > span {
				return 0, false, "", bad("step %q must be between 1 and %d", stepStr, span)
			}
		}
		for v := lo; v <= hi; v += step {
			if fd.isDOW() && v == 7 {
				set |= 1
			} else {
				set |= 1 << uint(v)
			}
		}
	}
	norm = f
	if fd.names != nil {
		norm = strings.ToUpper(f)
	}
	return set, star, norm, nil
}

// parseValue parses a number or a name of the field. sunName reports whether
// the value was the name SUN.
func parseValue(s string, fd *fieldDef, bad func(string, ...any) error) (v int, sunName bool, err error) {
	if s == "" {
		return 0, false, bad("missing value")
	}
	if isDigits(s) {
		if len(s) > 4 {
			return 0, false, bad("value %q out of range %d-%d", s, fd.min, fd.max)
		}
		v, _ = strconv.Atoi(s)
		if v < fd.min || v > fd.max {
			return 0, false, bad("value %d out of range %d-%d", v, fd.min, fd.max)
		}
		return v, false, nil
	}
	if fd.names != nil {
		for i, n := range fd.names {
			if n != "" && strings.EqualFold(s, n) {
				return i, fd.isDOW() && i == 0, nil
			}
		}
		return 0, false, bad("unknown value %q (want %d-%d or a name %s-%s)", s, fd.min, fd.max, fd.names[fd.min], fd.names[len(fd.names)-1])
	}
	return 0, false, bad("value %q is not a number", s)
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// cronSchedule is a parsed five-field expression (or descriptor).
type cronSchedule struct {
	minutes, hours, dom, months, dow uint64
	domStar, dowStar                 bool
	loc                              *time.Location
	spec                             string
}

// String returns the normalized spec.
func (s *cronSchedule) String() string { return s.spec }

// Location returns the location in which fields are evaluated.
func (s *cronSchedule) Location() *time.Location { return s.loc }

// maxDaysIn is the longest length of each month (February may have 29).
var maxDaysIn = [13]int{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}

// canFire reports whether some selected month has a selected day-of-month.
// When both day fields are restricted any matching weekday suffices.
func (s *cronSchedule) canFire() bool {
	if !s.domStar && !s.dowStar {
		return true
	}
	for m := 1; m <= 12; m++ {
		if s.months&(1<<uint(m)) == 0 {
			continue
		}
		// Bits 1..maxDaysIn[m].
		mask := uint64(1)<<uint(maxDaysIn[m]+1) - 2
		if s.dom&mask != 0 {
			return true
		}
	}
	return false
}

// civil is a wall-clock minute, without a time zone.
type civil struct{ y, mo, d, h, mi int }

func (c civil) less(o civil) bool {
	if c.y != o.y {
		return c.y < o.y
	}
	if c.mo != o.mo {
		return c.mo < o.mo
	}
	if c.d != o.d {
		return c.d < o.d
	}
	if c.h != o.h {
		return c.h < o.h
	}
	return c.mi < o.mi
}

// Bounds on the years Next works with, to keep the arithmetic far from
// overflow.
const (
	minYear = -1_000_000_000
	maxYear = 1_000_000_000
)

// maxCandidates bounds the number of matching wall-clock minutes Next
// examines that turn out not to be activations (they fall into a DST gap, or
// their first occurrence is not after t). In real zones this is at most a day
// worth of minutes.
const maxCandidates = 1 << 17

// Next returns the first activation strictly after t, in the schedule's
// location, or the zero time if there is none within 5 years.
func (s *cronSchedule) Next(t time.Time) time.Time {
	lt := t.In(s.loc)
	y, mo, d := lt.Date()
	if y < minYear || y > maxYear {
		return time.Time{}
	}
	h, mi, _ := lt.Clock()
	horizon := lt.AddDate(horizonYears, 0, 0)
	hy, hmo, hd := horizon.Date()
	hh, hmi, _ := horizon.Clock()
	// Wall-clock limit: the horizon's wall clock plus a day of slack for
	// offset changes; the instant check below is the exact bound.
	limit := civil{hy, int(hmo), hd + 1, hh, hmi}

	// Start at the wall-clock minute containing t. Candidates whose first
	// occurrence is not after t (t itself, or t inside a DST overlap) are
	// skipped.
	c := civil{y, int(mo), d, h, mi}
	tu := t.Unix()
	for range maxCandidates {
		var ok bool
		c, ok = s.nextCivil(c, limit)
		if !ok {
			return time.Time{}
		}
		if inst, ok := firstInstant(civilUnix(c), s.loc); ok {
			// Activations are whole seconds; t.Unix() truncates toward
			// the past, so inst > tu ⇔ inst > t, and inst == tu ⇔ inst <= t.
			if inst > tu {
				r := time.Unix(inst, 0).In(s.loc)
				if r.After(horizon) {
					return time.Time{}
				}
				return r
			}
		}
		c.mi++ // nextCivil normalizes the carry
	}
	return time.Time{}
}

// nextCivil returns the first wall-clock minute >= c that matches the fields,
// or false if there is none before limit. c may be denormalized by one unit in
// a single field (mi == 60, h == 24, d > days in month).
func (s *cronSchedule) nextCivil(c civil, limit civil) (civil, bool) {
	for {
		if c.mi > 59 {
			c.mi = 0
			c.h++
		}
		if c.h > 23 {
			c.h = 0
			c.mi = 0
			c.d++
		}
		if c.d > daysIn(c.y, c.mo) {
			c = civil{y: c.y, mo: c.mo + 1, d: 1}
		}
		if c.mo > 12 {
			c = civil{y: c.y + 1, mo: 1, d: 1}
		}
		if limit.less(c) {
			return c, false
		}
		m := nextBit(s.months, c.mo)
		if m < 0 {
			c = civil{y: c.y + 1, mo: 1, d: 1}
			continue
		}
		if m != c.mo {
			c = civil{y: c.y, mo: m, d: 1}
			continue // re-check the limit
		}
		d := s.nextDay(c.y, c.mo, c.d)
		if d < 0 {
			c = civil{y: c.y, mo: c.mo + 1, d: 1}
			continue
		}
		if d != c.d {
			c = civil{y: c.y, mo: c.mo, d: d}
			continue
		}
		hr := nextBit(s.hours, c.h)
		if hr < 0 {
			c = civil{y: c.y, mo: c.mo, d: c.d + 1}
			continue
		}
		if hr != c.h {
			c.h, c.mi = hr, 0
		}
		mn := nextBit(s.minutes, c.mi)
		if mn < 0 {
			c.h, c.mi = c.h+1, 0
			continue
		}
		c.mi = mn
		if limit.less(c) {
			return c, false
		}
		return c, true
	}
}

// nextDay returns the first matching day >= from in the month, or -1.
func (s *cronSchedule) nextDay(y, mo, from int) int {
	n := daysIn(y, mo)
	and := s.domStar || s.dowStar
	if and && s.dow&0x7f == 0x7f {
		// Every weekday matches: only day-of-month matters.
		d := nextBit(s.dom, from)
		if d < 0 || d > n {
			return -1
		}
		return d
	}
	wd := weekday(y, mo, from)
	for d := from; d <= n; d++ {
		domOK := s.dom&(1<<uint(d)) != 0
		dowOK := s.dow&(1<<uint(wd)) != 0
		if and && domOK && dowOK || !and && (domOK || dowOK) {
			return d
		}
		wd = (wd + 1) % 7
	}
	return -1
}

// nextBit returns the smallest set bit of set that is >= from, or -1.
func nextBit(set uint64, from int) int {
	if from < 0 {
		from = 0
	}
	if from > 63 {
		return -1
	}
	x := set >> uint(from) << uint(from)
	if x == 0 {
		return -1
	}
	return bits.TrailingZeros64(x)
}

func isLeap(y int) bool { return y%4 == 0 && (y%100 != 0 || y%400 == 0) }

func daysIn(y, mo int) int {
	if mo == 2 && !isLeap(y) {
		return 28
	}
	if mo < 1 || mo > 12 {
		return 31
	}
	return maxDaysIn[mo]
}

// daysFromCivil returns the number of days since 1970-01-01 of the proleptic
// Gregorian date y-mo-d (H. Hinnant's algorithm).
func daysFromCivil(y, mo, d int) int64 {
	yy := int64(y)
	if mo <= 2 {
		yy--
	}
	era := yy / 400
	if yy < 0 && yy%400 != 0 {
		era--
	}
	yoe := yy - era*400
	m := int64(mo)
	var mp int64
	if m > 2 {
		mp = m - 3
	} else {
		mp = m + 9
	}
	doy := (153*mp+2)/5 + int64(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// weekday returns 0 (Sunday) .. 6 (Saturday).
func weekday(y, mo, d int) int {
	w := (daysFromCivil(y, mo, d) + 4) % 7 // 1970-01-01 was a Thursday
	if w < 0 {
		w += 7
	}
	return int(w)
}

// civilUnix returns the Unix time at which the wall clock c would be shown in
// UTC.
func civilUnix(c civil) int64 {
	return daysFromCivil(c.y, c.mo, c.d)*86400 + int64(c.h)*3600 + int64(c.mi)*60
}

// zoneWindow is larger than any UTC offset, so every instant whose wall clock
// is a given civil time u lies within u ± zoneWindow.
const zoneWindow = 36 * 3600

// firstInstant returns the earliest instant (Unix seconds) whose wall clock in
// loc is the civil time u (given as civilUnix), or false if the wall clock
// never shows u (a DST gap).
//
// Each offset the zone uses within u ± zoneWindow gives one candidate,
// u - offset, which is valid if the zone uses that offset at the candidate
// itself; the earliest valid candidate is the answer. The offsets are
// sampled along the zone's periods as ZoneBounds reports them. Those bounds
// are not always the zone's transitions: past the last transition of its
// table, the time package derives periods from the zone's rule a year at a
// time and ends the last one of a leap year a day early, on Dec 31 00:00
// UTC, so an instant of that day gets an end that is not after it. The
// validity of a candidate is therefore checked by looking its offset up,
// never by the bounds, and a period whose end is not after the sampled
// instant is stepped over an hour at a time.
func firstInstant(u int64, loc *time.Location) (int64, bool) {
	p := time.Unix(u-zoneWindow, 0).In(loc)
	best, found := int64(0), false
	prevOff, first := 0, true
	for range 256 {
		_, off := p.Zone()
		if first || off != prevOff {
			cand := u - int64(off)
			if !found || cand < best {
				if _, o := time.Unix(cand, 0).In(loc).Zone(); o == off {
					best, found = cand, true
				}
			}
		}
		prevOff, first = off, false
		_, end := p.ZoneBounds()
		if end.IsZero() {
			break // no later transition
		}
		if !end.After(p) {
			end = p.Add(time.Hour) // not a real bound (see above)
		}
		if end.Unix() > u+zoneWindow {
			break
		}
		p = end.In(loc)
	}
	return best, found
}

// everySchedule fires at the multiples of every since the Unix epoch.
type everySchedule struct {
	every time.Duration
	loc   *time.Location
	spec  string
}

// String returns the normalized spec.
func (s *everySchedule) String() string { return s.spec }

// Location returns the location of the returned times.
func (s *everySchedule) Location() *time.Location { return s.loc }

// Next returns the first multiple of the interval since the Unix epoch that
// is strictly after t.
func (s *everySchedule) Next(t time.Time) time.Time {
	d := uint64(s.every)
	// rem = (t - epoch) mod d, computed in 128 bits from seconds and
	// nanoseconds so that no time value overflows.
	sec := t.Unix()
	secMod := sec % int64(d)
	if secMod < 0 {
		secMod += int64(d)
	}
	hi, lo := bits.Mul64(uint64(secMod), uint64(time.Second))
	rem := bits.Rem64(hi, lo, d)
	rem = (rem + uint64(t.Nanosecond())) % d
	next := t.Add(time.Duration(d - rem))
	if !next.After(t) {
		return time.Time{}
	}
	return next.Round(0).In(s.loc) // drop any monotonic reading of t
}

// Slots returns the activation times in (after, until], at most max of them,
// in order. It returns nil if s is nil or max <= 0.
func Slots(s Schedule, after, until time.Time, max int) []time.Time {
	if s == nil || max <= 0 {
		return nil
	}
	var out []time.Time
	t := after
	for len(out) < max {
		n := s.Next(t)
		if n.IsZero() || n.After(until) || !n.After(t) {
			break
		}
		out = append(out, n)
		t = n
	}
	return out
}
