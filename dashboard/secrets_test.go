package dashboard_test

import (
	"net/http"
	"testing"

	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// TestBearerTokenIsTrimmed: the configured token is trimmed the way the
// presented one is, so " x" logs in with "x" (it never could before).
func TestBearerTokenIsTrimmed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, _ := e.handler(dashboard.Options{BearerToken: "  padded-token\n"})
	for _, presented := range []string{"Bearer padded-token", "Bearer   padded-token  ", "bearer padded-token"} {
		r := do(t, h, req{method: http.MethodGet, path: "/", header: map[string]string{"Authorization": presented}})
		require.Equal(t, http.StatusOK, r.code, presented)
	}
	r := do(t, h, req{method: http.MethodGet, path: "/", header: map[string]string{"Authorization": "Bearer padded"}})
	require.Equal(t, http.StatusUnauthorized, r.code)
	_, err := dashboard.New(e.eng, dashboard.Options{BearerToken: " \t\n"})
	require.Error(t, err, "a token of white space only")
}
