package dashboard_test

import (
	"log"
	"net"
	"net/http"
	"os"

	"github.com/gendurable/gendurable"
	"github.com/gendurable/gendurable/dashboard"
)

// The dashboard mounted under /admin/gendurable/ of an existing server,
// behind basic auth, read-only for this deployment.
func ExampleNew() {
	var eng *gendurable.Engine // your engine, from gendurable.New
	h, err := dashboard.New(eng, dashboard.Options{
		BasePath:  "/admin/gendurable",
		BasicAuth: &dashboard.BasicAuth{User: "ops", Password: os.Getenv("DASHBOARD_PASSWORD")},
		ReadOnly:  true,
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/gendurable/", h)
	// Timeouts, a header limit and a bound on open connections.
	srv := dashboard.NewServer(mux, dashboard.ServerOptions{})
	ln, err := net.Listen("tcp", dashboard.DefaultAddr)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(dashboard.LimitListener(ln, 0)))
}
