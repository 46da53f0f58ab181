package dashboard_test

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"

	"github.com/gendurable/gendurable/dashboard"
	"github.com/stretchr/testify/require"
)

// TestHostHeaderIsChecked is the DNS-rebinding attack of the issue: on a
// loopback dashboard without authentication, a request whose Host (and
// Origin) name another site gets 421 and does nothing — no page, no signal
// stored — while the address the client connected to, loopback names and
// the allow-list are served.
func TestHostHeaderIsChecked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.insertOrder(Order{Item: "x"})
	local := &net.TCPAddr{IP: net.ParseIP("192.0.2.10"), Port: 18080}
	h, logs := e.handler(dashboard.Options{AllowedHosts: []string{"ops.example.com", "Proxy.Example.org:8443"}})

	signal := func(host string) resp {
		return do(t, h, req{method: http.MethodPost, path: fmt.Sprintf("/instances/%d/signal", id), host: host, local: local,
			form:   url.Values{"name": {"go"}, "payload": {`{"from":"` + host + `"}`}},
			header: map[string]string{"Origin": "http://" + host, "Sec-Fetch-Site": "same-origin"}})
	}
	for _, host := range []string{
		"evil.example:18080", "evil.example", "127.0.0.1.evil.example:18080", "localhost.evil.example",
		"192.0.2.11:18080", "proxy.example.org:9999", "ops.example.com.evil:18080", "[fe80::1%25eth0]:18080",
	} {
		r := do(t, h, req{method: http.MethodGet, path: fmt.Sprintf("/instances/%d", id), host: host, local: local})
		require.Equal(t, http.StatusMisdirectedRequest, r.code, "GET with Host %q", host)
		require.NotContains(t, r.body, `"item"`, host)
		require.Equal(t, "close", r.header.Get("Connection"))
		r = signal(host)
		require.Equal(t, http.StatusMisdirectedRequest, r.code, "POST with Host %q", host)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM {{s}}.gendurable_signals`), "no refused request stored a signal")
	require.Contains(t, logs.String(), "host not served")

	for _, host := range []string{
		"192.0.2.10:18080", "192.0.2.10", "127.0.0.1:18080", "127.0.0.2", "[::1]:18080", "localhost:18080", "LOCALHOST",
		"ops.example.com", "ops.example.com:18080", "OPS.example.com.", "proxy.example.org:8443",
	} {
		r := do(t, h, req{method: http.MethodGet, path: fmt.Sprintf("/instances/%d", id), host: host, local: local})
		require.Equal(t, http.StatusOK, r.code, "GET with Host %q", host)
		r = signal(host)
		require.Equal(t, http.StatusSeeOther, r.code, "POST with Host %q: %s", host, r.body)
	}
	require.Equal(t, 11, e.count(`SELECT count(*) FROM {{s}}.gendurable_signals`))

	// Over a real loopback connection, the address dialled is served.
	addr, _, _ := serve(t, h, dashboard.ServerOptions{})
	resp, err := http.Get("http://" + addr + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	rq, err := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	require.NoError(t, err)
	rq.Host = "evil.example:" + fmt.Sprint(local.Port)
	resp, err = http.DefaultClient.Do(rq)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode)

	// "*" turns the check off; a malformed entry is refused by New.
	open, _ := e.handler(dashboard.Options{AllowedHosts: []string{"*"}})
	require.Equal(t, http.StatusOK, do(t, open, req{method: http.MethodGet, path: "/", host: "anything.example"}).code)
	_, err = dashboard.New(e.eng, dashboard.Options{AllowedHosts: []string{"http://x/"}})
	require.Error(t, err)
	// Entries no Host header could match were taken and failed closed,
	// silently (a probe): a wildcard within a name, a port out of range.
	for _, bad := range []string{"*.example.com", "ops.*.com", "ops.example.com:99999", "ops.example.com:0",
		"ops.example.com:", "ops.example.com:12x", "ops.example.com:08443", "ops.example.com:+80", ":8443", "[::1",
		"ops\x1b.example.com", "ops\u202e.example.com", "bücher.example", "ops\x7f.example.com"} {
		_, err = dashboard.New(e.eng, dashboard.Options{AllowedHosts: []string{bad}})
		require.Error(t, err, "%q", bad)
	}
	for _, good := range []string{"ops.example.com:8443", "[2001:db8::1]", "[2001:db8::1]:8443", "2001:db8::1", "10.0.0.7:80"} {
		_, err = dashboard.New(e.eng, dashboard.Options{AllowedHosts: []string{good}})
		require.NoError(t, err, "%q", good)
	}
}
