package cron

import (
	"errors"
	"math/rand"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // make the zone tests independent of the host's zoneinfo

	"github.com/stretchr/testify/require"
)

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	return tm
}

func mustLoc(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		spec string
		msg  string // substring of the error message
	}{
		{"", "empty spec"},
		{"   \t ", "empty spec"},
		{"* * * *", "expected 5 fields"},
		{"* * * * * *", "expected 5 fields"},
		{"0 0 * * * 2024", "expected 5 fields"},
		{"60 * * * *", `minute field "60": value 60 out of range 0-59`},
		{"* 24 * * *", `hour field "24": value 24 out of range 0-23`},
		{"* * 0 * *", `day-of-month field "0": value 0 out of range 1-31`},
		{"* * 32 * *", `day-of-month field "32"`},
		{"* * * 0 *", `month field "0"`},
		{"* * * 13 *", `month field "13"`},
		{"* * * * 8", `day-of-week field "8": value 8 out of range 0-7`},
		{"99999999999999999999 * * * *", `minute field`},
		{"*/0 * * * *", `minute field "*/0": step "0" must be between 1 and 60`},
		{"*/-1 * * * *", `step "-1" is not a positive integer`},
		{"*/61 * * * *", `step "61" must be between 1 and 60`},
		{"*/ * * * *", `step "" is not a positive integer`},
		{"1/2/3 * * * *", "more than one step"},
		{"30-10 * * * *", `minute field "30-10": range "30-10" is reversed (30 > 10)`},
		{"* * * DEC-JAN *", `range "DEC-JAN" is reversed`},
		{"* * * * SAT-MON", `range "SAT-MON" is reversed`},
		{"-5 * * * *", "missing value"},
		{"5- * * * *", "missing value"},
		{"1-2-3 * * * *", `value "2-3" is not a number`},
		{"1,,2 * * * *", "empty list element"},
		{"1, * * * *", "empty list element"},
		{",1 * * * *", "empty list element"},
		{"? * * * *", `value "?" is not a number`},
		{"a * * * *", `minute field "a"`},
		{"0 0 L * *", `day-of-month field "L"`},
		{"* * * FOO *", `month field "FOO": unknown value "FOO"`},
		{"* * * * MON2", `unknown value "MON2"`},
		{"* * * MON *", `month field "MON"`},       // weekday name in the month field
		{"* * * * JAN", `day-of-week field "JAN"`}, // month name in the weekday field
		{"* * * * MONDAY", `unknown value "MONDAY"`},
		{"*-5 * * * *", `value "*" is not a number`},
		{"+5 * * * *", `value "+5" is not a number`},
		{"0x1 * * * *", `value "0x1" is not a number`},
		{"0 0 30 2 *", `day-of-month field "30" never occurs in month field "2"`},
		{"0 0 31 4,6,9,11 *", "never occurs"},
		{"@", `unknown descriptor "@"`},
		{"@fortnightly", `unknown descriptor "@fortnightly"`},
		{"@daily 5", "descriptor @daily takes no arguments"},
		{"@reboot", "unknown descriptor"},
		{"@every", "@every takes exactly one duration argument, got 0"},
		{"@every 1m 2m", "got 2"},
		{"@every 0s", `@every duration "0s": must be at least 1s`},
		{"@every 999ms", "must be at least 1s"},
		{"@every -5m", "must be at least 1s"},
		{"@every 5", `@every duration "5": not a valid duration`},
		{"@every soon", "not a valid duration"},
		{"@every 50000h", "must be at most"},
		{"TZ=Mars/Olympus_Mons * * * * *", `TZ prefix: unknown time zone "Mars/Olympus_Mons"`},
		{"CRON_TZ=Nowhere @daily", `CRON_TZ prefix: unknown time zone "Nowhere"`},
		{"TZ=../../etc/passwd * * * * *", "unknown time zone"},
		{"TZ= * * * * *", "empty time zone name"},
		{"TZ=Local * * * * *", `time zone "Local" is not allowed`},
		{"TZ=UTC", "missing schedule after TZ prefix"},
		{"TZ=UTC TZ=UTC * * * * *", "expected 5 fields"},
		{strings.Repeat("1,", 200) + "1 * * * *", "spec too long (409 bytes, max 256)"},
		{"\x00 * * * *", `minute field "\x00"`},
		{"é * * * *", "minute field"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			s, err := Parse(tt.spec)
			require.Error(t, err)
			require.Nil(t, s)
			require.ErrorIs(t, err, ErrInvalidSpec)
			require.Contains(t, err.Error(), tt.msg)
			require.True(t, strings.HasPrefix(err.Error(), "cron: invalid spec: "), err.Error())
		})
	}
}

func TestParseValid(t *testing.T) {
	for _, spec := range []string{
		"* * * * *",
		"0 0 1 1 *",
		"0-59 0-23 1-31 1-12 0-7",
		"59 23 31 12 7",
		"00 09 * * *",
		"*/1 */24 */31 */12 */7",
		"0 0 * jan-Dec sun-sat",
		"0 0 * * fri-sun",
		"0 0 29 2 *",
		"0 0 31 4 MON", // both restricted: fires on Mondays in April
		"@YEARLY",
		"@annually",
		"@every 1s",
		"@every 43800h",
		"  0   9\t*  *  MON-FRI  ",
		"TZ=America/New_York 0 9 * * *",
		"CRON_TZ=Europe/Berlin @daily",
		"TZ=UTC @every 1h",
	} {
		s, err := Parse(spec)
		require.NoError(t, err, spec)
		require.NotNil(t, s, spec)
	}
}

func TestString(t *testing.T) {
	tests := []struct{ spec, want string }{
		{"*/15 * * * *", "*/15 * * * *"},
		{"  0   9\t*  *  mon-fri ", "0 9 * * MON-FRI"},
		{"0 0 1 jan,Jul *", "0 0 1 JAN,JUL *"},
		{"@annually", "@yearly"},
		{"@Midnight", "@daily"},
		{"@hourly", "@hourly"},
		{"@every 90s", "@every 1m30s"},
		{"@every 1h30m", "@every 1h30m0s"},
		{"TZ=America/New_York 0 9 * * *", "CRON_TZ=America/New_York 0 9 * * *"},
		{"CRON_TZ=Europe/Berlin   @weekly", "CRON_TZ=Europe/Berlin @weekly"},
	}
	for _, tt := range tests {
		s, err := Parse(tt.spec)
		require.NoError(t, err, tt.spec)
		str := s.(interface{ String() string }).String()
		require.Equal(t, tt.want, str, tt.spec)
		// The normalized form parses to the same schedule.
		s2, err := Parse(str)
		require.NoError(t, err)
		require.Equal(t, str, s2.(interface{ String() string }).String())
		from := mustTime(t, "2024-01-01T00:00:00Z")
		require.Equal(t, Slots(s, from, from.AddDate(0, 1, 0), 50), Slots(s2, from, from.AddDate(0, 1, 0), 50))
	}
}

func TestNext(t *testing.T) {
	tests := []struct {
		spec string
		from string
		want string // "" means the zero time
	}{
		// Steps.
		{"*/15 * * * *", "2024-01-01T10:07:30Z", "2024-01-01T10:15:00Z"},
		{"*/15 * * * *", "2024-01-01T10:15:00Z", "2024-01-01T10:30:00Z"}, // strictly after
		{"*/15 * * * *", "2024-01-01T10:14:59.999999999Z", "2024-01-01T10:15:00Z"},
		{"*/15 * * * *", "2024-12-31T23:50:00Z", "2025-01-01T00:00:00Z"},
		{"5/20 * * * *", "2024-01-01T10:26:00Z", "2024-01-01T10:45:00Z"},
		{"5/20 * * * *", "2024-01-01T10:45:00Z", "2024-01-01T11:05:00Z"},
		{"10-30/10 8 * * *", "2024-01-01T08:30:00Z", "2024-01-02T08:10:00Z"},
		{"* * * * *", "2024-02-28T23:59:59Z", "2024-02-29T00:00:00Z"},
		// Weekdays.
		{"0 9 * * MON-FRI", "2024-01-05T09:00:00Z", "2024-01-08T09:00:00Z"}, // Fri -> Mon
		{"0 9 * * MON-FRI", "2024-01-06T12:00:00Z", "2024-01-08T09:00:00Z"}, // Sat -> Mon
		{"0 9 * * MON-FRI", "2024-01-08T08:59:59Z", "2024-01-08T09:00:00Z"},
		{"0 9 * * 1-5", "2024-01-03T09:00:00Z", "2024-01-04T09:00:00Z"},
		{"0 0 * * 0", "2024-01-01T00:00:00Z", "2024-01-07T00:00:00Z"},
		{"0 0 * * 7", "2024-01-01T00:00:00Z", "2024-01-07T00:00:00Z"},
		{"0 0 * * SUN", "2024-01-01T00:00:00Z", "2024-01-07T00:00:00Z"},
		{"0 0 * * 5-7", "2024-01-06T00:00:00Z", "2024-01-07T00:00:00Z"},
		{"0 0 * * FRI-SUN", "2024-01-01T00:00:00Z", "2024-01-05T00:00:00Z"},
		{"0 0 * * FRI-SUN", "2024-01-06T00:00:00Z", "2024-01-07T00:00:00Z"},
		{"0 0 * * FRI-SUN", "2024-01-07T00:00:00Z", "2024-01-12T00:00:00Z"},
		// Days of month.
		{"0 0 1,15 * *", "2024-01-01T00:00:00Z", "2024-01-15T00:00:00Z"},
		{"0 0 1,15 * *", "2024-01-15T00:00:01Z", "2024-02-01T00:00:00Z"},
		{"0 0 31 * *", "2024-04-01T00:00:00Z", "2024-05-31T00:00:00Z"},
		// Day-of-month OR day-of-week when both are restricted.
		{"0 0 13 * FRI", "2024-01-01T00:00:00Z", "2024-01-05T00:00:00Z"}, // Friday 5th
		{"0 0 13 * FRI", "2024-01-12T00:00:00Z", "2024-01-13T00:00:00Z"}, // Saturday 13th
		{"0 0 13 * FRI", "2024-01-13T00:00:00Z", "2024-01-19T00:00:00Z"},
		{"0 0 13 * *", "2024-01-01T00:00:00Z", "2024-01-13T00:00:00Z"},
		// "*/2" counts as unrestricted (Vixie): odd days AND Friday.
		{"0 0 */2 * FRI", "2024-01-01T00:00:00Z", "2024-01-05T00:00:00Z"},
		{"0 0 */2 * FRI", "2024-01-06T00:00:00Z", "2024-01-19T00:00:00Z"},
		{"0 0 * * */2", "2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z"}, // Tue (0,2,4,6)
		// Months.
		{"0 0 1 JAN,jul *", "2024-01-01T00:00:00Z", "2024-07-01T00:00:00Z"},
		{"0 0 1 */3 *", "2024-02-01T00:00:00Z", "2024-04-01T00:00:00Z"},
		// Leap years.
		{"0 12 29 2 *", "2023-03-01T00:00:00Z", "2024-02-29T12:00:00Z"},
		{"0 12 29 2 *", "2024-02-29T12:00:00Z", "2028-02-29T12:00:00Z"},
		{"0 12 29 2 *", "2096-02-29T12:00:00Z", ""}, // 2100 is not leap; 2104 is > 5 years away
		{"0 12 29 2 *", "2099-06-01T00:00:00Z", "2104-02-29T12:00:00Z"},
		// Descriptors.
		{"@hourly", "2024-01-01T10:00:00Z", "2024-01-01T11:00:00Z"},
		{"@hourly", "2024-01-01T10:59:59.999Z", "2024-01-01T11:00:00Z"},
		{"@daily", "2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z"},
		{"@midnight", "2024-01-01T12:00:00Z", "2024-01-02T00:00:00Z"},
		{"@weekly", "2024-01-03T00:00:00Z", "2024-01-07T00:00:00Z"},
		{"@monthly", "2024-01-31T00:00:00Z", "2024-02-01T00:00:00Z"},
		{"@yearly", "2024-06-01T00:00:00Z", "2025-01-01T00:00:00Z"},
		{"@annually", "2024-12-31T23:59:59Z", "2025-01-01T00:00:00Z"},
		// @every is aligned to the Unix epoch.
		{"@every 90s", "1970-01-01T00:00:00Z", "1970-01-01T00:01:30Z"},
		{"@every 90s", "2024-01-01T00:00:00Z", "2024-01-01T00:01:30Z"}, // 1704067200 = 90*18934080
		{"@every 90s", "2024-01-01T00:00:10Z", "2024-01-01T00:01:30Z"},
		{"@every 90s", "2024-01-01T00:01:29.999999999Z", "2024-01-01T00:01:30Z"},
		{"@every 90s", "2024-01-01T00:01:30Z", "2024-01-01T00:03:00Z"},
		{"@every 90s", "1969-12-31T23:59:00Z", "1970-01-01T00:00:00Z"},
		{"@every 90s", "1969-12-31T23:57:00Z", "1969-12-31T23:58:30Z"},
		{"@every 7m", "2024-01-01T00:00:00Z", "2024-01-01T00:01:00Z"}, // 1704067260 = 420*4057303
		{"@every 1h30m", "2024-01-01T00:00:00Z", "2024-01-01T01:30:00Z"},
		{"@every 1h30m", "2024-01-01T01:00:00Z", "2024-01-01T01:30:00Z"},
		{"@every 1.5s", "1970-01-01T00:00:01Z", "1970-01-01T00:00:01.5Z"},
		{"@every 24h", "2024-03-05T17:00:00Z", "2024-03-06T00:00:00Z"},
		// Time zones.
		{"TZ=America/New_York 0 9 * * *", "2024-03-09T15:00:00Z", "2024-03-10T09:00:00-04:00"},
		{"CRON_TZ=Asia/Kolkata 0 0 * * *", "2024-01-01T00:00:00Z", "2024-01-02T00:00:00+05:30"},
		{"TZ=America/New_York @every 1h", "2024-01-01T00:30:00Z", "2024-01-01T01:00:00Z"}, // zone does not move @every slots
		// DST gap: 02:30 does not exist in New York on 2024-03-10.
		{"TZ=America/New_York 30 2 * * *", "2024-03-09T08:00:00Z", "2024-03-11T02:30:00-04:00"},
		{"TZ=America/New_York 0 3 * * *", "2024-03-10T06:59:00Z", "2024-03-10T03:00:00-04:00"},
		// DST overlap: 01:30 happens twice on 2024-11-03; the first (EDT) fires.
		{"TZ=America/New_York 30 1 * * *", "2024-11-03T04:00:00Z", "2024-11-03T01:30:00-04:00"},
		{"TZ=America/New_York 30 1 * * *", "2024-11-03T05:30:00Z", "2024-11-04T01:30:00-05:00"},
		// From inside the second 01:xx, the repeated minutes are skipped.
		{"TZ=America/New_York */15 * * * *", "2024-11-03T06:20:00Z", "2024-11-03T02:00:00-05:00"},
		{"TZ=America/New_York */15 * * * *", "2024-11-03T05:50:00Z", "2024-11-03T02:00:00-05:00"},
	}
	for _, tt := range tests {
		t.Run(tt.spec+"@"+tt.from, func(t *testing.T) {
			s, err := Parse(tt.spec)
			require.NoError(t, err)
			got := s.Next(mustTime(t, tt.from))
			if tt.want == "" {
				require.True(t, got.IsZero(), "got %v", got)
				return
			}
			want := mustTime(t, tt.want)
			require.True(t, want.Equal(got), "want %v, got %v", want, got)
			if !strings.HasPrefix(tt.spec, "@every") {
				require.Zero(t, got.Second())
				require.Zero(t, got.Nanosecond())
			}
		})
	}
}

func TestNextLocation(t *testing.T) {
	ny := mustLoc(t, "America/New_York")
	from := mustTime(t, "2024-01-01T00:00:00Z")

	s, err := Parse("0 9 * * *")
	require.NoError(t, err)
	require.Equal(t, time.UTC, s.Next(from).Location())

	s, err = ParseInLocation("0 9 * * *", ny)
	require.NoError(t, err)
	got := s.Next(from)
	require.Equal(t, ny, got.Location())
	require.Equal(t, "2024-01-01T09:00:00-05:00", got.Format(time.RFC3339))

	// A prefix overrides the ParseInLocation location.
	s, err = ParseInLocation("TZ=Europe/Berlin 0 9 * * *", ny)
	require.NoError(t, err)
	require.Equal(t, "2024-01-01T09:00:00+01:00", s.Next(from).Format(time.RFC3339))

	// nil means UTC.
	s, err = ParseInLocation("@every 1h", nil)
	require.NoError(t, err)
	require.Equal(t, time.UTC, s.Next(from).Location())

	// The input's location does not matter, only the instant.
	s, err = ParseInLocation("0 9 * * *", ny)
	require.NoError(t, err)
	require.True(t, s.Next(from).Equal(s.Next(from.In(mustLoc(t, "Asia/Tokyo")))))
}

func TestSlots(t *testing.T) {
	times := func(ss ...string) []time.Time {
		out := make([]time.Time, len(ss))
		for i, s := range ss {
			out[i] = mustTime(t, s)
		}
		return out
	}
	equal := func(t *testing.T, want, got []time.Time) {
		t.Helper()
		require.Len(t, got, len(want), "got %v", got)
		for i := range want {
			require.True(t, want[i].Equal(got[i]), "slot %d: want %v, got %v", i, want[i], got[i])
		}
	}
	s, err := Parse("*/15 * * * *")
	require.NoError(t, err)
	after, until := mustTime(t, "2024-01-01T10:00:00Z"), mustTime(t, "2024-01-01T11:00:00Z")
	// (after, until]: after is excluded, until included.
	equal(t, times("2024-01-01T10:15:00Z", "2024-01-01T10:30:00Z", "2024-01-01T10:45:00Z", "2024-01-01T11:00:00Z"),
		Slots(s, after, until, 100))
	equal(t, times("2024-01-01T10:15:00Z", "2024-01-01T10:30:00Z"), Slots(s, after, until, 2))
	require.Nil(t, Slots(s, after, until, 0))
	require.Nil(t, Slots(s, after, until, -1))
	require.Nil(t, Slots(nil, after, until, 10))
	require.Empty(t, Slots(s, until, after, 10)) // empty interval
	require.Empty(t, Slots(s, after, after.Add(14*time.Minute), 10))

	e, err := Parse("@every 90s")
	require.NoError(t, err)
	equal(t, times("2024-01-01T00:01:30Z", "2024-01-01T00:03:00Z", "2024-01-01T00:04:30Z"),
		Slots(e, mustTime(t, "2024-01-01T00:00:00Z"), mustTime(t, "2024-01-01T00:05:00Z"), 10))

	// Hourly across the New York fall-back: 01:00 EST (06:00Z) repeats
	// 01:00 EDT (05:00Z) and is skipped.
	ny, err := Parse("TZ=America/New_York 0 * * * *")
	require.NoError(t, err)
	equal(t, times("2024-11-03T04:00:00Z", "2024-11-03T05:00:00Z", "2024-11-03T07:00:00Z", "2024-11-03T08:00:00Z"),
		Slots(ny, mustTime(t, "2024-11-03T03:30:00Z"), mustTime(t, "2024-11-03T08:00:00Z"), 10))
	// Hourly across the spring-forward: 02:00 does not exist.
	slots := Slots(ny, mustTime(t, "2024-03-10T04:30:00Z"), mustTime(t, "2024-03-10T09:00:00Z"), 10)
	equal(t, times("2024-03-10T05:00:00Z", "2024-03-10T06:00:00Z", "2024-03-10T07:00:00Z", "2024-03-10T08:00:00Z", "2024-03-10T09:00:00Z"), slots)
	var hours []int
	for _, sl := range slots {
		hours = append(hours, sl.Hour())
	}
	require.Equal(t, []int{0, 1, 3, 4, 5}, hours)

	// A whole year of a daily schedule in New York: one per day, all at 09:00.
	d, err := Parse("CRON_TZ=America/New_York 0 9 * * *")
	require.NoError(t, err)
	year := Slots(d, mustTime(t, "2024-01-01T00:00:00Z"), mustTime(t, "2025-01-01T00:00:00Z"), 1000)
	require.Len(t, year, 366)
	for _, sl := range year {
		require.Equal(t, 9, sl.Hour())
		require.Zero(t, sl.Minute())
	}
}

// reference is a brute-force Next for cron schedules: it walks instants
// minute by minute and applies the documented matching, gap and overlap
// rules. It assumes the zone's offsets are whole minutes.
func reference(s *cronSchedule, t time.Time, limit time.Duration) time.Time {
	start := t.Truncate(time.Minute)
	for i := start; i.Sub(start) <= limit; i = i.Add(time.Minute) {
		if !i.After(t) {
			continue
		}
		w := i.In(s.loc)
		y, mo, d := w.Date()
		if s.minutes&(1<<uint(w.Minute())) == 0 || s.hours&(1<<uint(w.Hour())) == 0 ||
			s.months&(1<<uint(mo)) == 0 || s.nextDay(y, int(mo), d) != d {
			continue
		}
		repeated := false
		for k := 1; k <= 12; k++ { // same wall clock up to 3h earlier?
			p := i.Add(-time.Duration(k) * 15 * time.Minute).In(s.loc)
			py, pmo, pd := p.Date()
			if py == y && pmo == mo && pd == d && p.Hour() == w.Hour() && p.Minute() == w.Minute() {
				repeated = true
				break
			}
		}
		if !repeated {
			return w
		}
	}
	return time.Time{}
}

func TestNextMatchesBruteForce(t *testing.T) {
	specs := []string{
		"* * * * *",
		"*/15 * * * *",
		"0 * * * *",
		"30 * * * *",
		"*/7 1-3 * * *",
		"0,30 2 * * *",
		"30 1,2 * * *",
		"15 0-4/2 * * *",
		"0 0 * * *",
		"59 23 * * *",
		"45 1 * * SUN",
		"0 12 13 * FRI",
		"0 0 */2 * MON-WED",
		"10 3 * * 0,6",
	}
	zones := []string{"UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "America/Santiago", "Asia/Kolkata"}
	// Start instants around DST changes and elsewhere.
	bases := []string{
		"2024-03-10T00:00:00Z", "2024-11-03T00:00:00Z", // US
		"2024-03-31T00:00:00Z", "2024-10-27T00:00:00Z", // EU
		"2024-04-06T12:00:00Z", "2024-10-05T12:00:00Z", // Lord Howe (30 min)
		"2024-04-06T00:00:00Z", "2024-09-07T00:00:00Z", // Santiago (midnight changes)
		"2024-06-15T00:00:00Z", "2024-12-31T20:00:00Z",
	}
	rng := rand.New(rand.NewSource(1))
	found := 0
	samples := 4
	if testing.Short() {
		samples = 1
	}
	for _, zone := range zones {
		loc := mustLoc(t, zone)
		for _, spec := range specs {
			sc, err := ParseInLocation(spec, loc)
			require.NoError(t, err)
			cs := sc.(*cronSchedule)
			for _, b := range bases {
				base := mustTime(t, b)
				for range samples {
					from := base.Add(time.Duration(rng.Int63n(int64(48 * time.Hour))))
					if rng.Intn(2) == 0 {
						from = from.Truncate(time.Minute)
					}
					want := reference(cs, from, 8*24*time.Hour)
					got := cs.Next(from)
					require.True(t, want.Equal(got), "%s in %s from %v: want %v, got %v", spec, zone, from, want, got)
					if !got.IsZero() {
						found++
						require.Equal(t, want.String(), got.String())
					}
				}
			}
		}
	}
	// Every spec fires within 8 days of every start.
	require.Equal(t, len(zones)*len(specs)*len(bases)*samples, found)
}

func TestHistoricalZoneChanges(t *testing.T) {
	// Samoa skipped 2011-12-30 entirely: that day's activation is in the gap.
	s, err := Parse("TZ=Pacific/Apia 0 12 * * *")
	require.NoError(t, err)
	var days []int
	for _, sl := range Slots(s, mustTime(t, "2011-12-28T00:00:00Z"), mustTime(t, "2012-01-02T00:00:00Z"), 10) {
		require.Equal(t, 12, sl.Hour())
		days = append(days, sl.Day())
	}
	require.Equal(t, []int{28, 29, 31, 1, 2}, days)

	// Alaska moved back almost a day in 1867 (wall clock of 1867-10-19
	// 00:00-15:33 repeated): each wall-clock time fires once.
	s, err = Parse("TZ=America/Juneau 0 */6 * * *")
	require.NoError(t, err)
	var walls []string
	for _, sl := range Slots(s, mustTime(t, "1867-10-18T00:00:00Z"), mustTime(t, "1867-10-21T00:00:00Z"), 20) {
		walls = append(walls, sl.Format("01-02 15:04"))
	}
	require.Equal(t, []string{"10-18 18:00", "10-19 00:00", "10-19 06:00", "10-19 12:00", "10-19 18:00", "10-20 00:00", "10-20 06:00", "10-20 12:00"}, walls)
}

// Past the last transition of a zone's table (2037 in the zoneinfo files
// Go embeds and fat system files, the last rule change in slim ones) the
// time package derives a zone's periods from its rule a year at a time, and
// in a leap year ends the last period on Dec 31 00:00 UTC, a day early: an
// instant of that day gets a ZoneBounds end that is not after it.
// firstInstant used to take that for a DST gap, so every activation whose
// search window touched that day was skipped — about 36 hours around every
// such new year, and a whole year of "@yearly" in America/New_York.
func TestNextAcrossTheLastDayOfALeapYearPastTheZoneTable(t *testing.T) {
	for _, tc := range []struct{ zone, spec string }{
		{"America/New_York", "0 0 * * *"},
		{"America/New_York", "0 12 * * *"},
		{"Europe/London", "0 * * * *"},
		{"Australia/Sydney", "*/30 * * * *"},
		{"America/Santiago", "15 3 * * *"},
	} {
		sc, err := ParseInLocation(tc.spec, mustLoc(t, tc.zone))
		require.NoError(t, err)
		cs := sc.(*cronSchedule)
		for _, year := range []int{2040, 2044, 2400} {
			from := time.Date(year, 12, 29, 0, 0, 0, 0, time.UTC)
			for n := 0; n < 400; n++ {
				want := reference(cs, from, 3*24*time.Hour)
				got := cs.Next(from)
				require.False(t, want.IsZero())
				require.True(t, want.Equal(got), "%s in %s from %v: want %v, got %v", tc.spec, tc.zone, from, want, got)
				if from.After(time.Date(year+1, 1, 2, 12, 0, 0, 0, time.UTC)) {
					break
				}
				from = got
			}
		}
	}
	s, err := Parse("TZ=America/New_York @yearly")
	require.NoError(t, err)
	require.Equal(t, "2041-01-01T00:00:00-05:00", s.Next(mustTime(t, "2040-06-01T00:00:00Z")).Format(time.RFC3339))
}

// ruleOnlyZone is a zone whose offsets all come from the POSIX TZ rule tz (a
// TZif file with no transitions), as a zone's times after its last table
// entry do; in slim zoneinfo files (zic's default) that is every year since
// the zone's last rule change — 2007 for America/New_York.
func ruleOnlyZone(t *testing.T, name, std, tz string, stdOffset int32) *time.Location {
	t.Helper()
	var b []byte
	be32 := func(v uint32) { b = append(b, byte(v>>24), byte(v>>16), byte(v>>8), byte(v)) }
	for range 2 { // the version 1 block, then the version 2 block
		b = append(b, "TZif2"...)
		b = append(b, make([]byte, 15)...)
		for _, n := range []int{0, 0, 0, 0, 1, len(std) + 1} { // isut, isstd, leap, time, type, char counts
			be32(uint32(n))
		}
		be32(uint32(stdOffset))
		b = append(b, 0, 0) // not DST, abbreviation index 0
		b = append(b, std...)
		b = append(b, 0)
	}
	b = append(b, "\n"+tz+"\n"...)
	loc, err := time.LoadLocationFromTZData(name, b)
	require.NoError(t, err)
	return loc
}

// TestNextAcrossTheLastDayOfALeapYearInARuleOnlyZone: the same as
// TestNextAcrossTheLastDayOfALeapYearPastTheZoneTable in a zone as slim
// zoneinfo files give it: there the days skipped were those around
// 2024-12-31, and next 2028-12-31.
func TestNextAcrossTheLastDayOfALeapYearInARuleOnlyZone(t *testing.T) {
	loc := ruleOnlyZone(t, "America/New_York", "EST", "EST5EDT,M3.2.0,M11.1.0", -5*3600)
	for _, spec := range []string{"0 0 * * *", "0 * * * *", "30 9 * * *"} {
		sc, err := ParseInLocation(spec, loc)
		require.NoError(t, err)
		cs := sc.(*cronSchedule)
		for _, year := range []int{2024, 2028} {
			from := time.Date(year, 12, 29, 0, 0, 0, 0, time.UTC)
			for from.Before(time.Date(year+1, 1, 2, 12, 0, 0, 0, time.UTC)) {
				want := reference(cs, from, 3*24*time.Hour)
				got := cs.Next(from)
				require.False(t, want.IsZero())
				require.True(t, want.Equal(got), "%s from %v: want %v, got %v", spec, from, want, got)
				from = got
			}
		}
	}
}

func TestNextExtremes(t *testing.T) {
	for _, spec := range []string{"* * * * *", "0 0 29 2 *", "@every 1s", "@every 43800h", "TZ=America/New_York 30 2 * * *"} {
		s, err := Parse(spec)
		require.NoError(t, err)
		for _, from := range []time.Time{
			{},
			time.Unix(0, 0),
			time.Unix(-1<<40, 0),
			time.Unix(1<<40, 0),
			time.Unix(1<<62, 999999999),
			time.Unix(-1<<62, 0),
			time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
			time.Date(-50, 1, 1, 0, 0, 0, 0, time.UTC),
		} {
			got := s.Next(from)
			if !got.IsZero() {
				require.True(t, got.After(from), "%s from %v: %v", spec, from, got)
			}
		}
	}
	// Far from the epoch @every stays aligned.
	s, err := Parse("@every 7s")
	require.NoError(t, err)
	got := s.Next(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC))
	require.Zero(t, got.Unix()%7)
	got = s.Next(time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC))
	require.Zero(t, got.Unix()%7)
	require.Zero(t, got.Nanosecond())
}

func TestNeverFiringWithinHorizon(t *testing.T) {
	// Parses (Feb 29 exists) but is > 5 years away from 2097 onwards.
	s, err := Parse("0 0 29 2 *")
	require.NoError(t, err)
	require.True(t, s.Next(mustTime(t, "2097-01-01T00:00:00Z")).IsZero())
	require.Empty(t, Slots(s, mustTime(t, "2097-01-01T00:00:00Z"), mustTime(t, "2200-01-01T00:00:00Z"), 10))
}

func TestErrorsAreDistinct(t *testing.T) {
	_, err := Parse("61 * * * *")
	require.True(t, errors.Is(err, ErrInvalidSpec))
	require.False(t, errors.Is(ErrInvalidSpec, err))
}

func BenchmarkNext(b *testing.B) {
	for _, spec := range []string{"*/15 * * * *", "0 12 29 2 *", "TZ=America/New_York 0 9 * * MON-FRI", "@every 90s"} {
		s, err := Parse(spec)
		if err != nil {
			b.Fatal(err)
		}
		from := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
		b.Run(spec, func(b *testing.B) {
			for b.Loop() {
				s.Next(from)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"* * * * *", "*/15 * * * *", "0 9 * * MON-FRI", "0 0 1,15 * *", "0 0 13 * FRI",
		"0 12 29 2 *", "5/20 1-5/2 */3 JAN-jun 0-7", "0 0 * * FRI-SUN", "59 23 31 12 7",
		"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly",
		"@every 90s", "@every 1h30m", "@every 1.5s", "@every 0s", "@every -1s",
		"TZ=America/New_York 30 1 * * *", "CRON_TZ=Australia/Lord_Howe */10 * * * *",
		"TZ=Europe/Berlin @every 7m", "TZ=", "TZ=Local @daily", "",
		"1-2-3 * * * *", "*/0 * * * *", "60 * * * *", "1,,2 * * * *", "@", "@every",
		"0 0 30 2 *", "\x00", "é * * * *",
	} {
		f.Add(seed)
	}
	froms := []time.Time{
		time.Date(2024, 3, 10, 6, 59, 30, 0, time.UTC),
		time.Date(2024, 11, 3, 5, 30, 0, 0, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 500, time.UTC),
		time.Date(2099, 2, 28, 23, 59, 59, 0, time.UTC),
	}
	f.Fuzz(func(t *testing.T, spec string) {
		s, err := Parse(spec)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidSpec)
			require.Nil(t, s)
			return
		}
		require.LessOrEqual(t, len(spec), MaxSpecLen)
		str := s.(interface{ String() string }).String()
		s2, err := Parse(str)
		require.NoError(t, err, "normalized %q of %q does not parse", str, spec)
		require.Equal(t, str, s2.(interface{ String() string }).String())
		_, every := s.(*everySchedule)
		for _, from := range froms {
			next := s.Next(from)
			if next.IsZero() {
				continue
			}
			require.True(t, next.After(from), "%q: Next(%v) = %v", spec, from, next)
			require.False(t, next.After(from.AddDate(5, 0, 0)), "%q: Next(%v) = %v beyond horizon", spec, from, next)
			require.True(t, next.Equal(s2.Next(from)))
			if !every {
				require.Zero(t, next.Second())
				require.Zero(t, next.Nanosecond())
			}
			after := s.Next(next)
			if !after.IsZero() {
				require.True(t, after.After(next))
			}
		}
	})
}

// FuzzNext checks Next's invariants for arbitrary start instants: the result
// is strictly after t, within the horizon, on a whole minute (cron specs), and
// no activation is skipped between t and the result.
func FuzzNext(f *testing.F) {
	specs := []string{
		"* * * * *", "*/15 * * * *", "30 1 * * *", "0,30 2 * * *", "0 0 13 * FRI",
		"0 0 */2 * MON", "0 12 29 2 *", "59 23 31 12 *", "@every 90s", "@every 1.5s",
	}
	zones := []string{"UTC", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Pacific/Apia", "America/Juneau"}
	f.Add(uint8(0), uint8(1), int64(1730611800), int64(0))
	f.Add(uint8(2), uint8(1), int64(1730615400), int64(1))
	f.Add(uint8(3), uint8(2), int64(1712329200), int64(0))
	f.Add(uint8(6), uint8(0), int64(4070908800), int64(0))
	f.Add(uint8(8), uint8(4), int64(-1), int64(999999999))
	f.Add(uint8(1), uint8(4), int64(1325239200), int64(0))  // Samoa skipped 2011-12-30
	f.Add(uint8(4), uint8(5), int64(-3225223727), int64(0)) // Alaska 1867
	scheds := make([][]Schedule, len(specs))
	for i, spec := range specs {
		for _, z := range zones {
			loc, err := time.LoadLocation(z)
			require.NoError(f, err)
			s, err := ParseInLocation(spec, loc)
			require.NoError(f, err)
			scheds[i] = append(scheds[i], s)
		}
	}
	f.Fuzz(func(t *testing.T, si, zi uint8, sec, nsec int64) {
		s := scheds[int(si)%len(specs)][int(zi)%len(zones)]
		// Keep t within ±10000 years of the epoch.
		const span = 10000 * 366 * 86400
		sec %= span
		nsec %= int64(time.Second)
		from := time.Unix(sec, nsec)
		next := s.Next(from)
		if next.IsZero() {
			return
		}
		require.True(t, next.After(from), "Next(%v) = %v", from, next)
		require.False(t, next.After(from.AddDate(5, 0, 0)), "Next(%v) = %v beyond horizon", from, next)
		if _, every := s.(*everySchedule); !every {
			require.Zero(t, next.Second())
			require.Zero(t, next.Nanosecond())
		}
		// Starting anywhere in [from, next) gives the same result.
		mid := from.Add(next.Sub(from) / 2)
		require.True(t, next.Equal(s.Next(mid)), "Next(%v) = %v but Next(%v) = %v", from, next, mid, s.Next(mid))
		require.True(t, next.Equal(s.Next(next.Add(-time.Nanosecond))))
	})
}
