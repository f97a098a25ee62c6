# marksplit — see README.md. Every target runs from the repository root.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
VERSION     ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
REVISION    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE      ?= https://github.com/marksplit/marksplit
# Every timestamp in the image: the last commit's time, so an image is
# reproducible from its commit.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
LDFLAGS     := -s -w -X main.version=$(VERSION)
FUZZTIME    ?= 10s
export MARKSPLIT_CACHE ?= /var/cache/marksplit

.PHONY: all build test test-k8s bench bench-compare fuzz lint demo image image-docker release clean

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
	cd tools/image && $(GO) test -count=1 ./...
	$(MAKE) test-k8s

# Builds etcd and kube-apiserver once (cached in $${MARKSPLIT_CACHE:-/var/cache/marksplit})
# and runs the agent against them.
test-k8s:
	cd test/k8s && $(GO) run ./cmd/k8sdeps && $(GO) test -count=1 -timeout 60m ./...

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
	cd test/k8s && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	cd tools/image && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	cd bench && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...

demo:
	scripts/demo.sh

# The agent's image, without a container daemon and without pulling
# anything: the release binaries on an empty base, an OCI index for
# linux/amd64 and linux/arm64, as an OCI image-layout archive (tools/image).
image: release
	cd tools/image && $(GO) run . -out $(CURDIR)/bin/marksplit-image.tar \
	  -version $(VERSION) -revision $(REVISION) -source $(SOURCE) -epoch $(SOURCE_DATE_EPOCH) \
	  linux/amd64=$(CURDIR)/bin/marksplit-linux-amd64 linux/arm64=$(CURDIR)/bin/marksplit-linux-arm64

# The same image with Docker (deploy/Dockerfile; pulls golang to compile in).
image-docker:
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
	  --build-arg SOURCE=$(SOURCE) --build-arg SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) -t marksplit:$(VERSION) .

# Static binaries for amd64 and arm64. No VCS stamp (-buildvcs=false): the
# Dockerfile's build has no .git, and the two must build the same binary.
release:
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -buildvcs=false -ldflags "$(LDFLAGS)" -o bin/marksplit-linux-amd64 ./agent
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -buildvcs=false -ldflags "$(LDFLAGS)" -o bin/marksplit-linux-arm64 ./agent

clean:
	rm -rf bin
