# marksplit — see README.md. Every target runs from the repository root.

SHELL       := bash
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

.PHONY: all build test test-k8s test-image test-wireguard test-kernels kernel-check bench bench-compare fuzz lint demo image image-docker release clean

all: build

build:
	$(GO) build -o bin/marksplit ./agent
	$(GO) build -o bin/watch ./examples/watch

# The one test command (README.md, .ci/run): unit, fake-kernel and
# real-kernel tests, the manifests, the image tool, the agent against a real
# kube-apiserver, the image in an OCI runtime as the DaemonSet runs it, and
# the agent's effect on a real WireGuard tunnel.
# The real-kernel parts need root and network namespaces: without them one
# line says so and they are skipped (MARKSPLIT_KERNEL_TESTS=1, as in CI,
# makes that a failure). The first run builds etcd and kube-apiserver from
# their Go modules (about 10 min on 2 cores; cached in $(MARKSPLIT_CACHE))
# and installs runc from Debian when it is missing: 18 min in all on a fresh
# 2-core machine; later runs about 2.5 min. The WireGuard tests add about
# half a minute (a first run installs wireguard-tools and builds wireguard-go:
# about a minute more).
test: kernel-check
	@echo "== go test -race ./... (unit, fake-kernel and real-kernel tests)"
	$(GO) test -race -count=1 -timeout 30m ./...
	@echo "== the attacks on the probes and the scrapes at full speed (the race detector slows the server past the probes' real 2 s timeout, so -race skips the biggest floods)"
	$(GO) test -count=1 -run 'UnderIdleFlood|BadTokenFlood' ./internal/metricsserver ./internal/kubeauth
	@echo "== the manifests, the benchmark tool, the image tool"
	cd deploy && $(GO) test -count=1 ./...
	cd bench && $(GO) test -count=1 -timeout 30m ./...
	cd tools/image && $(GO) test -count=1 ./...
	@$(MAKE) --no-print-directory test-k8s test-image test-wireguard

# skip_unless_kernel ends a recipe line with a "skipped" line when the
# real-kernel tests cannot run here, or fails it under MARKSPLIT_KERNEL_TESTS=1.
skip_unless_kernel = if ! why=$$(scripts/kernel-check.sh); then \
	  if [ "$${MARKSPLIT_KERNEL_TESTS:-}" = 1 ]; then echo "$@: MARKSPLIT_KERNEL_TESTS=1, but $$why" >&2; exit 1; fi; \
	  echo "== $@: skipped: $$why"; exit 0; fi

kernel-check:
	@$(skip_unless_kernel); echo "== root and network namespaces: the real-kernel tests run"

# The agent against a real kube-apiserver and etcd, built once from their
# pinned Go modules (test/k8s/etcd, test/k8s/kube-apiserver); k8sdeps shows
# the progress of a first build.
test-k8s:
	@$(skip_unless_kernel); \
	echo "== test/k8s: etcd and kube-apiserver (built once into $(MARKSPLIT_CACHE)), then the agent against them"; \
	cd test/k8s && $(GO) run ./cmd/k8sdeps && $(GO) test -count=1 -timeout 60m ./...

# The amd64 image of `make image`, run by runc with deploy/daemonset.yaml's
# security context in a throwaway network namespace.
test-image: image
	@$(skip_unless_kernel); \
	echo "== test/image: bin/marksplit-image.tar in runc, as deploy/daemonset.yaml runs it"; \
	cd test/image && MARKSPLIT_IMAGE=$(CURDIR)/bin/marksplit-image.tar $(GO) test -count=1 -v -timeout 30m ./...

# The agent on a real WireGuard tunnel between two node namespaces: FragOKs
# climbs without it and stays flat with it, a flap is put right within a
# second, a wrong mark is caught. wireguard-go is built once from its pinned
# module (test/wireguard/wireguard-go) into $(MARKSPLIT_CACHE) unless the
# kernel has WireGuard; wg comes from Debian's wireguard-tools.
test-wireguard:
	@$(skip_unless_kernel); \
	echo "== test/wireguard: the agent's effect on a real WireGuard tunnel"; \
	scripts/install-wireguard-tools.sh && \
	cd test/wireguard && $(GO) test -count=1 -v -timeout 30m ./...

# The real-kernel tests on the kernels users run: Debian's own 5.10
# (bullseye), 6.1 (bookworm) and 6.12 (trixie), generic flavour, each with
# its own modules, booted in QEMU under TCG (nested KVM hangs here), two
# guests at once, 2.5 GiB and 2 CPUs each, with a cgroup v2 mount. They run
# the TestKernel tests of netwatch, netwatch/reconcile, netwatchtest (and
# its engine netwatch/internal/fakekernel), mtupolicy, the agent and the
# examples, and test/wireguard with the kernel's WireGuard module. One line per kernel
# says uname -r, passed/failed/skipped with each skip's reason, which
# WireGuard ran, the time, and how many tests were left to FULL=1; then
# the WireGuard figures. test/kernels/plan.go lists the suites (one test
# binary each: a line there runs another in the guests).
# Go runs 15 to 50 times slower in the guests, so by default (and in CI)
# the three kernels share about 20 minutes: every kernel runs netwatchtest,
# fakekernel (the fake compared with the kernel), reconcile, netwatch but
# for its long tests, and test/wireguard; 6.1 also mtupolicy, four of the
# agent's single-node tests and its big passes in a cgroup v2 memory limit
# (TestKernelMemoryCgroup), 5.10 netwatch's Overflow, 6.12 the
# examples and netwatch's IPv6 multipath tests. Left to FULL=1 (every
# suite on every kernel, about 45 min per kernel): netwatch's randomized
# and large-table tests (minutes each in a guest), the agent's multi-node
# tests, and the suites a kernel does not run by default; each kernel's
# line counts them and the list follows it. KERNELS=6.1 boots one kernel.
# The first run fetches the kernels, busybox, cpio and kmod from Debian into
# $(MARKSPLIT_CACHE)/kernels and installs qemu-system-x86 without
# recommends.
test-kernels:
	@$(skip_unless_kernel); \
	echo "== test/kernels: Debian's 5.10, 6.1 and 6.12 in QEMU, the real-kernel tests in each"; \
	scripts/install-wireguard-tools.sh && \
	cd test/kernels && $(GO) run . $(if $(FULL),-full) $(if $(KERNELS),-kernels $(KERNELS))

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
	@if $(GO) list -deps ./... | grep '^golang.zx2c4.com/wireguard' | grep -qv '^golang.zx2c4.com/wireguard/wgctrl'; then echo "the library must not build wireguard-go's packages (test/wireguard pins it; wgctrl's go.mod names its module, which nothing here compiles)"; exit 1; fi
	@if $(GO) mod graph | grep -qE 'helm\.sh|sigs\.k8s\.io/kustomize'; then echo "go.mod: the library must not depend on helm or kustomize (deploy/ tests the chart and the manifests)"; exit 1; fi
	cd deploy && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	cd test/k8s && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	cd tools/image && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	cd test/image && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	cd bench && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	cd test/wireguard && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	cd test/kernels && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	@echo "== actionlint .github/workflows (tools/actionlint pins it; shellcheck checks run: scripts when installed)"
	cd tools/actionlint && $(GO) tool actionlint -no-color $(addprefix ../../,$(wildcard .github/workflows/*.yml))

demo:
	scripts/demo.sh

# The agent's image, without a container daemon and without pulling
# anything: the release binaries on an empty base, an OCI index for
# linux/amd64 and linux/arm64, as an OCI image-layout archive (tools/image).
# Beside each image, an SPDX SBOM of its binary (every Go module and version
# of its build info) as an OCI artifact whose subject is that image.
# .github/workflows/release.yml pushes it on a tag (docs/operations.md).
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
