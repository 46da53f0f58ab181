package main

import (
	"errors"
	"testing"
	"time"

	"github.com/gendurable/gendurable/bench/longhorizon"
)

func TestOverridePhases(t *testing.T) {
	phases, err := overridePhases(longhorizon.DefaultPhases(), "clean=5m, idle-in-tx=20m")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Duration{}
	for _, p := range phases {
		got[p.Name] = p.Duration
	}
	if got["clean"] != 5*time.Minute || got["idle-in-tx"] != 20*time.Minute || got["warmup"] != 3*time.Minute {
		t.Fatalf("%v", got)
	}
	for _, bad := range []string{"clean", "clean=soon", "nap=1m", "clean=-1m"} {
		if _, err := overridePhases(longhorizon.DefaultPhases(), bad); !errors.Is(err, longhorizon.ErrInvalidOption) {
			t.Errorf("%q: %v, want ErrInvalidOption", bad, err)
		}
	}
}
