// Command kernels is `make test-kernels`: it boots Debian's own kernel
// packages (5.10 from bullseye, 6.1 from bookworm, 6.12 from trixie, the
// generic flavour, each with its own modules) in QEMU and runs the
// project's real-kernel tests in each, with the kernel's WireGuard. It
// prints one line per kernel: uname -r, the tests passed, failed and
// skipped (with each skip's reason), the WireGuard the tests used and the
// time, then the WireGuard figures.
//
// # How
//
// fetch.sh fetches and caches the kernels, busybox-static, cpio, kmod and
// QEMU in $MARKSPLIT_CACHE/kernels. The test binaries are built on the
// host (CGO_ENABLED=0 go test -c) and run in the guest as they are. The
// guest's root is the host's / read-only over 9p under an overlay with a
// tmpfs on top (init.sh), the kernel's modules a second 9p share, and the
// run's directory a third, writable one where the guest writes each test
// binary's test2json output (guest.sh). QEMU runs under TCG: nested KVM
// hangs on this kind of machine. Go runs about 15 times slower there.
//
// # What runs
//
// plan.go lists the suites (one test binary and a -test.run pattern each)
// and what each kernel runs by default; -full runs every suite on every
// kernel (make test-kernels FULL=1). A suite is one line of the guest's
// plan: adding a test binary to the guests is one entry in plan.go.
package main
