//go:build linux

package main

import (
	"os"
	"testing"

	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// newNetNS is netwatchtest.NewNetNS under this project's policy for
// real-kernel tests: they skip where they cannot run, and fail instead with
// MARKSPLIT_KERNEL_TESTS=1, which its CI sets.
func newNetNS(t testing.TB) *netwatchtest.NetNS {
	t.Helper()
	if os.Getenv("MARKSPLIT_KERNEL_TESTS") == "1" {
		netwatchtest.RequireKernel(t)
	}
	return netwatchtest.NewNetNS(t)
}
