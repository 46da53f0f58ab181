# gendurable — developer targets. `make test` is what CI runs.
GO ?= go
STATICCHECK_VERSION ?= v0.8.2
PKGS := ./...

.PHONY: test check fmt-check vet lint test-only demo bench bench-backlog bench-micro bench-compare

## test: format check, vet, staticcheck, then every test with the race detector
test: check test-only

test-only:
	$(GO) test -race -count=1 $(PKGS)
	cd bench && $(GO) vet ./... && $(GO) test -count=1 ./...
	cd otel && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	cd e2e && $(GO) vet ./... && $(GO) test -count=1 ./...

check: fmt-check vet lint

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

lint:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PKGS)

## demo: the quickstart demo (throwaway PostgreSQL unless DATABASE_URL is set)
demo:
	$(GO) run ./examples/quickstart

## bench: every workload of `gendurable bench` against DATABASE_URL (default: the local server)
bench:
	@for w in job fsm3 signal fanout partition; do $(GO) run ./cmd/gendurable bench --workload $$w -n 20000 || exit 1; done

## bench-backlog: one pick's latency at 10k and 1M runnable rows
bench-backlog:
	$(GO) run ./cmd/gendurable bench --backlog

## bench-micro: Go micro-benchmarks of the non-SQL hot path
bench-micro:
	$(GO) test -run XXX -bench . -benchmem -count 5 .

## bench-compare: gendurable vs River on the same database (module bench/)
bench-compare:
	cd bench && $(GO) run ./cmd/compare
