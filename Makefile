# gendurable — developer targets. `make test` is what CI runs.
GO ?= go
STATICCHECK_VERSION ?= v0.8.2
PKGS := ./...

.PHONY: test check fmt-check vet lint test-only demo

## test: format check, vet, staticcheck, then every test with the race detector
test: check test-only

test-only:
	$(GO) test -race -count=1 $(PKGS)

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
