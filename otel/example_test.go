package gdotel_test

import (
	"context"
	"log"

	"github.com/gendurable/gendurable"
	gdotel "github.com/gendurable/gendurable/otel"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The README's wiring, kept compiling.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	sendEmail := &gendurable.Job[struct{ To string }]{
		Name:    "send_email",
		Perform: func(ctx context.Context, j *gendurable.Run[struct{ To string }]) error { return nil },
	}

	hook, err := gdotel.New(gdotel.Options{Pool: pool, Schema: "public"}) // global Meter/TracerProvider
	if err != nil {
		log.Fatal(err)
	}
	defer hook.Close() // unregisters the queue-depth callback

	eng, err := gendurable.New(pool, &gendurable.Config{
		Machines: []gendurable.Definition{sendEmail},
		Queues:   map[string]gendurable.QueueConfig{"default": {}},
		Hooks:    []gendurable.Hook{hook},
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = eng.Start(ctx)
}
