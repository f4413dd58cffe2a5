# Kiln: `make run` sets up and starts the server; `make test` runs every test.
# Both install what they need (apt packages, the built-in templates) idempotently.

export PATH := /usr/local/go/bin:$(PATH)
export GOTOOLCHAIN ?= auto
GO ?= go
KILN_DATA_DIR ?= /var/lib/kiln
export KILN_DATA_DIR
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION) -X github.com/kiln-sh/kiln/internal/agent.Version=$(VERSION)

.PHONY: setup deps build run test gotest fuzz soak bench clean console-vendor image desktop

## deps: install system packages (runsc, runc, debootstrap, ...) if missing,
## and a recent static gVisor runsc built from the Go module proxy (cached);
## with Go already there, the runsc build runs beside the apt installs
## (Nomad, Helm, etcd and kube-apiserver, which only test/nomad and
## test/helm need, are not deps: make test builds them in the background
## from its start, and those tests build them if missing, with
## scripts/install-{nomad,helm,kube}.sh, cached in /usr/local/lib/kiln)
deps:
	@if command -v go >/dev/null; then \
		scripts/install-runsc.sh & runsc=$$!; \
		scripts/setup-deps.sh; rc=$$?; wait $$runsc; rrc=$$?; \
		[ $$rc -eq 0 ] && [ $$rrc -eq 0 ]; \
	else scripts/setup-deps.sh && scripts/install-runsc.sh; fi

## build: bin/kiln and the static bin/kiln-agent
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/kiln-agent ./cmd/kiln-agent
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/kiln ./cmd/kiln

## image: Kiln's container image, built without a container engine
## (cmd/kiln-image): the base template's Debian root filesystem plus kiln,
## kiln-agent, runsc and runc, as the OCI image layout bin/kiln-image and the
## docker-save tarball bin/kiln-image.tar; PUSH=host/repo:tag pushes it too
## (deploy/helm/kiln/README.md)
image: setup
	$(GO) run ./cmd/kiln-image -tag kiln:$(VERSION) -out bin/kiln-image -tar bin/kiln-image.tar $(if $(PUSH),-push $(PUSH))

## setup: deps, build, and the built-in templates (base, then code-interpreter on
## base's layers), built by the template engine; the first build takes minutes
## (Debian packages), later ones find every step cached
setup: deps build
	bin/kiln template build

## desktop: the on-demand built-in desktop template (XFCE, Firefox, noVNC;
## docs/desktop.md), which make setup leaves out: ~225 MB of Debian packages,
## about a minute the first time, then cached
desktop: setup
	bin/kiln template build desktop

## run: set up, then start kiln serve
run: setup
	bin/kiln serve

## test: set up, then run the whole test suite (root-only tests need root)
## and every fuzz target for a bounded time
test:
	@# First, in the background and niced: the builds of etcd and
	@# kube-apiserver, Nomad and Helm, which only test/helm and test/nomad
	@# need (minutes each on a new machine, ~19 min for kube-apiserver on
	@# a loaded one; cached after). They start before setup so that they
	@# use the CPU setup leaves idle while it downloads; those tests wait
	@# for them, or build them if these failed. Their output follows the
	@# tests'. The desktop template is built (setup, then it) before the
	@# tests, so that test packages running in parallel find it built.
	@# The fuzz targets run after the tests, on a quiet machine:
	@# beside them, a starved FuzzAgentMethods worker was killed and the
	@# kernels it had started held its pipes, so the fuzzer's coordinator
	@# waited forever.
	@tools=$$(mktemp); rc=1; \
		{ nice -n 10 scripts/install-kube.sh & nice -n 10 scripts/install-nomad.sh & nice -n 10 scripts/install-helm.sh; wait; } >$$tools 2>&1 & tb=$$!; \
		$(MAKE) --no-print-directory desktop && $(MAKE) --no-print-directory gotest; rc=$$?; \
		wait $$tb; cat $$tools; rm -f $$tools; \
		[ $$rc -eq 0 ]
	$(MAKE) --no-print-directory fuzz

# gotest: gofmt, vet and the tests, once set up (make test)
gotest:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "not gofmt'ed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 25m ./...

## fuzz: each fuzz target for FUZZTIME (crashers land in the package's
## testdata/fuzz: commit them with the fix)
FUZZTIME ?= 5s
FUZZ_TARGETS := \
	./internal/server:FuzzCreateSandboxBody ./internal/server:FuzzCommandBody ./internal/server:FuzzQuery \
	./internal/agentapi/channel:FuzzFrameReader ./internal/agentapi/channel:FuzzAgentInput \
	./internal/agentapi/channel:FuzzHostInput ./internal/agent/files:FuzzResolve ./internal/agent:FuzzAgentMethods
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($${t%%:*}, $(FUZZTIME))"; \
		out=$$(timeout -k 10 300 $(GO) test -run='^$$' -fuzz="^$${t#*:}\$$" -fuzztime=$(FUZZTIME) $${t%%:*} 2>&1 </dev/null) || { echo "$$out"; exit 1; }; \
		echo "$$out" | tail -1; \
	done

## soak: the 10-minute soak under the race detector (make test runs it for 30 s)
soak: setup
	$(GO) test -count=1 -race -timeout 30m -run '^TestSoak$$' ./test/reliability -soak=10m -v

## bench: benchmarks, results in docs/benchmarks.md
bench: setup
	bin/kiln bench

## console-vendor: the web console's third-party files (xterm.js, uPlot) from
## the locked npm packages into internal/console/assets/vendor, with their
## checksums; the copies are committed, so `make build` needs no node
CONSOLE_WEB := internal/console/web
CONSOLE_VENDOR := internal/console/assets/vendor
console-vendor:
	cd $(CONSOLE_WEB) && npm ci --ignore-scripts --no-audit --no-fund
	rm -rf $(CONSOLE_VENDOR) && mkdir -p $(CONSOLE_VENDOR)
	grep -v '^#' $(CONSOLE_WEB)/vendor.txt | while read -r src name; do \
		cp $(CONSOLE_WEB)/node_modules/$$src $(CONSOLE_VENDOR)/$$name || exit 1; done
	cd $(CONSOLE_VENDOR) && sha256sum $$(grep -v '^#' ../../web/vendor.txt | cut -d' ' -f2) > SHA256SUMS

clean:
	rm -rf bin
