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

// TestCredentialsWithControlCharactersAreRefused: a bearer token no HTTP
// header can carry, or basic-auth credentials with a control character
// (RFC 7617 forbids them; no browser can type one), are refused by New.
// Before, a token file of two lines ("abc\ndef") gave a dashboard that
// started and refused every login.
func TestCredentialsWithControlCharactersAreRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, o := range []dashboard.Options{
		{BearerToken: "first-line\nsecond-line"},
		{BearerToken: "tok\x00en"},
		{BearerToken: "tok\x1b[2Jen"},
		{BearerToken: "tok\x7fen"},
		{BearerToken: "tok\u0085en"},
		{BasicAuth: &dashboard.BasicAuth{User: "ops", Password: "pass\nword"}},
		{BasicAuth: &dashboard.BasicAuth{User: "o\tps", Password: "password"}},
	} {
		_, err := dashboard.New(e.eng, o)
		require.ErrorContains(t, err, "control character", "%+v", o)
	}
	// Spaces inside are not control characters.
	_, err := dashboard.New(e.eng, dashboard.Options{BearerToken: "two words", BasicAuth: &dashboard.BasicAuth{User: "ops", Password: "pass word é"}})
	require.NoError(t, err)
}
