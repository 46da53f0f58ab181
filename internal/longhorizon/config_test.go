package longhorizon

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestFromEnvDefaultsAndModes(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://x/db", "PRODUCER_RATE": "200", "WORKER_COUNT": "8"}))
	require.NoError(t, err)
	require.Equal(t, Config{DatabaseURL: "postgres://x/db", Scenario: ScenarioLongHorizon, ProducerMode: ModeFixed,
		ProducerRate: 200, WorkerCount: 8, PayloadBytes: 256, WorkMs: 1, SampleEvery: 5 * time.Second}, c)

	c, err = FromEnv(env(map[string]string{"DATABASE_URL": "postgres://x/db", "PRODUCER_MODE": "depth-target", "TARGET_DEPTH": "1000",
		"WORKER_COUNT": "4", "JOB_PAYLOAD_BYTES": "0", "JOB_WORK_MS": "0", "SAMPLE_EVERY_S": "2", "BENCH_INSTANCE_ID": "1",
		"PRODUCER_RATE_CONTROL_FILE": "/tmp/rate"}))
	require.NoError(t, err)
	require.Equal(t, Config{DatabaseURL: "postgres://x/db", Scenario: ScenarioLongHorizon, ProducerMode: ModeDepthTarget,
		TargetDepth: 1000, WorkerCount: 4, SampleEvery: 2 * time.Second, InstanceID: 1, RateControlFile: "/tmp/rate"}, c)
}

func TestFromEnvRejects(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": "postgres://x/db", "PRODUCER_RATE": "200", "WORKER_COUNT": "8"}
	for k, v := range map[string]string{"PRODUCER_RATE": "-1", "WORKER_COUNT": "10001", "JOB_WORK_MS": "x",
		"SAMPLE_EVERY_S": "0", "BENCH_INSTANCE_ID": "-1", "TARGET_DEPTH": "-1", "SCENARIO": "all", "PRODUCER_MODE": "x"} {
		kv := map[string]string{}
		for a, b := range base {
			kv[a] = b
		}
		kv[k] = v
		_, err := FromEnv(env(kv))
		require.ErrorIs(t, err, ErrInvalidEnv, "%s=%s", k, v)
		require.Contains(t, err.Error(), k)
	}
	_, err := FromEnv(env(map[string]string{"DATABASE_URL": "postgres://x/db", "PRODUCER_RATE": "NaN", "WORKER_COUNT": "8"}))
	require.ErrorIs(t, err, ErrInvalidEnv)
	_, err = FromEnv(env(map[string]string{"DATABASE_URL": "postgres://x/db", "PRODUCER_MODE": "depth-target", "TARGET_DEPTH": "0", "WORKER_COUNT": "8"}))
	require.ErrorIs(t, err, ErrInvalidEnv)
	_, err = FromEnv(env(map[string]string{"DATABASE_URL": "postgres://x/db", "PRODUCER_RATE": "0", "TARGET_DEPTH": "0", "WORKER_COUNT": "8"}))
	require.NoError(t, err, "fixed mode ignores TARGET_DEPTH; rate 0 produces nothing")
}

func TestNextBoundaryIsAWallClockMultiple(t *testing.T) {
	t.Parallel()
	at := nextBoundary(time.Date(2026, 4, 17, 9, 0, 7, 300, time.UTC), 5*time.Second)
	require.Equal(t, time.Date(2026, 4, 17, 9, 0, 10, 0, time.UTC), at)
	at = nextBoundary(time.Date(2026, 4, 17, 9, 0, 10, 0, time.UTC), 5*time.Second)
	require.Equal(t, time.Date(2026, 4, 17, 9, 0, 15, 0, time.UTC), at)
}
