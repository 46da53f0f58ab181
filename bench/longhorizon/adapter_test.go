package longhorizon

import (
	"errors"
	"testing"
	"time"
)

func TestParseDescriptor(t *testing.T) {
	d, err := ParseDescriptor([]byte(`{"kind":"descriptor","system":"gendurable","event_tables":["lh.gendurable_instances"],"extensions":[],"version":"v1","schema_version":9,"db_name":"lh_gendurable","started_at":"2026-11-24T15:00:00Z"}`))
	if err != nil || d.System != "gendurable" || len(d.EventTables) != 1 {
		t.Fatalf("%+v %v", d, err)
	}
	for _, bad := range []string{`{"kind":"adapter","system":"x","event_tables":["t"]}`, `{"kind":"descriptor","event_tables":["t"]}`,
		`{"kind":"descriptor","system":"x"}`, `not json`} {
		if _, err := ParseDescriptor([]byte(bad)); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", bad, err)
		}
	}
}

func TestParsePoint(t *testing.T) {
	want := time.Unix(1_764_000_000, 0)
	for _, ts := range []string{`1764000000`, `1764000000000`, `"2025-11-24T16:00:00Z"`, `"1764000000"`} {
		p, err := ParsePoint([]byte(`{"t":`+ts+`,"system":"river","kind":"adapter","subject_kind":"adapter","subject":"","metric":"claim_p95_ms","value":4.25,"window_s":30}`), "river")
		if err != nil || !p.T.Equal(want) || p.Metric != MetricClaimP95 || p.Value != 4.25 || p.WindowS != 30 {
			t.Errorf("t %s: %+v %v", ts, p, err)
		}
	}
	for _, bad := range []string{
		`{"t":1,"system":"gendurable","kind":"adapter","metric":"queue_depth","value":1}`, // other system
		`{"t":1,"system":"river","kind":"descriptor","metric":"queue_depth","value":1}`,
		`{"t":1,"system":"river","kind":"adapter","value":1}`,
		`{"t":1,"system":"river","kind":"adapter","metric":"queue_depth"}`,
		`{"system":"river","kind":"adapter","metric":"queue_depth","value":1}`,
		`{"t":"yesterday","system":"river","kind":"adapter","metric":"queue_depth","value":1}`,
	} {
		if _, err := ParsePoint([]byte(bad), "river"); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", bad, err)
		}
	}
}
