# marksplit — see README.md. Every target runs from the repository root.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
VERSION     ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(VERSION)
FUZZTIME    ?= 10s

.PHONY: all build test test-k8s bench bench-compare fuzz lint demo image release clean

all: build

build:
	$(GO) build -o bin/marksplit ./agent
	$(GO) build -o bin/watch ./examples/watch

# The tests: unit, fake-kernel and real-kernel (in throwaway network
# namespaces; needs root — MARKSPLIT_KERNEL_TESTS=1 turns skips into failures).
test:
	$(GO) test -race -count=1 ./...
	cd deploy && $(GO) test -count=1 ./...
	cd bench && $(GO) test -count=1 ./...
	$(MAKE) test-k8s

# Builds kube-apiserver once (cached in $${MARKSPLIT_CACHE:-/var/cache/marksplit})
# and runs the agent against it; etcd-server must be installed (.ci/run does).
test-k8s:
	cd test/k8s && $(GO) test -count=1 -timeout 60m ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# Side by side with vishvananda/netlink, rtnetlink, iproute2 and the 30 s
# polling loop, in a fresh namespace (root); regenerates BENCHMARKS.md.
bench-compare:
	cd bench && $(GO) run . -out ../BENCHMARKS.md

fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	cd deploy && $(GO) vet ./...
	cd test/k8s && $(GO) vet ./...
	cd bench && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...

demo:
	scripts/demo.sh

image:
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) -t marksplit:$(VERSION) .

release:
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/marksplit-linux-amd64 ./agent
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/marksplit-linux-arm64 ./agent

clean:
	rm -rf bin
