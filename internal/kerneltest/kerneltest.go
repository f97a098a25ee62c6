//go:build linux

// Package kerneltest is this project's policy for real-kernel tests: they
// skip where network namespaces are not available, and fail instead with
// MARKSPLIT_KERNEL_TESTS=1, which CI sets. The public test kit
// (netwatchtest) knows no such variable: it skips, or fails when told to.
package kerneltest

import (
	"os"
	"testing"

	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// Required reports whether real-kernel tests must run here
// (MARKSPLIT_KERNEL_TESTS=1).
func Required() bool { return os.Getenv("MARKSPLIT_KERNEL_TESTS") == "1" }

// NewNetNS is netwatchtest.NewNetNS, failing instead of skipping when
// Required.
func NewNetNS(t testing.TB) *netwatchtest.NetNS {
	t.Helper()
	if Required() {
		netwatchtest.RequireKernel(t)
	}
	return netwatchtest.NewNetNS(t)
}
