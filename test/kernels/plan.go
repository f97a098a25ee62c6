package main

import (
	"slices"
	"strings"
)

// suite is one test binary run in a guest.
type suite struct {
	name   string   // names its output: NAME.json
	module string   // the module's directory, relative to the repository
	pkg    string   // the package, relative to the module
	run    string   // -test.run: every real-kernel test of the package
	env    []string // extra environment, KEY=VALUE; @agent is the prebuilt agent
}

// suites are the real-kernel tests of every package that has them, and
// the WireGuard tests with the kernel's WireGuard. fakekernel is the engine
// behind netwatchtest: its TestKernelFaithful compares the fake with the
// kernel. To run another test binary in the guests, add it here (and to
// budget).
var suites = []suite{
	{name: "netwatch", pkg: "./netwatch", run: "^TestKernel"},
	{name: "reconcile", pkg: "./netwatch/reconcile", run: "^TestKernel"},
	{name: "netwatchtest", pkg: "./netwatch/netwatchtest", run: "^TestKernel"},
	{name: "fakekernel", pkg: "./netwatch/internal/fakekernel", run: "^TestKernel"},
	{name: "mtupolicy", pkg: "./mtupolicy", run: "^TestKernel"},
	{name: "agent", pkg: "./agent", run: "^TestKernel", env: []string{"MARKSPLIT_AGENT=@agent", "MARKSPLIT_TIME_SCALE=20"}},
	{name: "uplinkpin", pkg: "./examples/uplinkpin", run: "^TestKernel", env: []string{"MARKSPLIT_TIME_SCALE=20"}},
	{name: "vpnbypass", pkg: "./examples/vpnbypass", run: "^TestKernel", env: []string{"MARKSPLIT_TIME_SCALE=20"}},
	{name: "watch", pkg: "./examples/watch", run: "^TestKernel", env: []string{"MARKSPLIT_TIME_SCALE=20"}},
	{name: "wireguard", module: "test/wireguard", pkg: ".", run: "^TestKernel",
		env: []string{"MARKSPLIT_AGENT=@agent", "MARKSPLIT_WIREGUARD=kernel", "MARKSPLIT_TIME_SCALE=20"}},
}

// Under TCG the tests run 15 to 50 times slower than on the host (more
// on a busy one): every suite on every kernel takes about 45 minutes per
// kernel there. By default (make test-kernels, CI) each kernel runs what
// fits in about 20 minutes for all three, two guests at once: 6.1 alone
// in one, 5.10 then 6.12 in the other.
//   - Every kernel: netwatchtest and fakekernel (the fake against the
//     kernel), netwatch/reconcile's real-kernel test, netwatch's
//     real-kernel tests but for the long ones, with SilentChanges (what the
//     kernel removes without an event), and test/wireguard (the kernel's
//     WireGuard: FragOKs without and with the agent, the flap, host TCP,
//     and TestKernelWireGuardMesh: --wireguard-link through peer add,
//     remove, endpoint roam and allowed-IP changes).
//   - 6.1: mtupolicy's real-kernel cases, four of the agent's
//     single-node tests (netlink_diag's origins among them), and its big
//     passes in a memory cgroup at the DaemonSet's limit
//     (TestKernelMemoryCgroup: cgroup v2 in the guest, where this host
//     has v1; about 3.5 min, while 5.10 and then 6.12 run beside it).
//   - 5.10: the oldest: netwatch's Overflow (ENOBUFS and the resync).
//   - 6.12: the examples (but their fight tests, which need a fighter
//     faster than a TCG guest runs one), and netwatch's IPv6 multipath and
//     shared keys.
//
// Left to FULL=1 (every suite on every kernel, about 45 min per kernel):
// netwatch's randomized and large-table tests (RandomChanges,
// LargeTableChurn, Barrier, RouteAliases: minutes each in a guest), most
// of the agent's tests (TestKernelUnderlayFlapsAreNoFight alone takes two
// minutes there), and whatever a kernel above does not run; each kernel's
// line counts what it left out and lists it.
var (
	netwatchLong = []string{"TestKernelRandomChanges", "TestKernelOverflow", "TestKernelLargeTableChurn",
		"TestKernelBarrier", "TestKernelRouteAliases", "TestKernelRunStopsDuringDump", "TestKernelIPv6SharedKey",
		"TestKernelIPv6Multipath"}
	// The agent on one node: following the kernel, naming the program it
	// fights through netlink_diag (a module), leaving its routes on
	// SIGTERM, cleaning up.
	agentSingleNode = []string{"TestKernelRunFollowsTheKernel", "TestKernelFightNamesProgram",
		"TestKernelSignalLeavesRoutes", "TestKernelCleanupLeavesNoTrace"}
)

// choice is what a kernel runs of one suite: run (a -test.run pattern)
// and skip (a -test.skip pattern), either empty.
type choice struct{ run, skip string }

var budget = map[string]map[string]choice{
	"6.1": {
		"netwatchtest": {},
		"fakekernel":   {},
		"reconcile":    {},
		"netwatch":     {skip: anyOf(netwatchLong...)},
		"mtupolicy":    {},
		"agent":        {run: anyOf(append(agentSingleNode, "TestKernelMemoryCgroup")...)},
		"wireguard":    {},
	},
	"5.10": {
		"netwatchtest": {},
		"fakekernel":   {},
		"reconcile":    {},
		"netwatch":     {skip: anyOf(without(netwatchLong, "TestKernelOverflow")...)},
		"wireguard":    {},
	},
	"6.12": {
		"netwatchtest": {},
		"fakekernel":   {},
		"reconcile":    {},
		"netwatch":     {skip: anyOf(without(netwatchLong, "TestKernelIPv6SharedKey", "TestKernelIPv6Multipath")...)},
		// Their TestKernelFight needs a fighter fast enough to reach the
		// fight detector's repair rate, which a TCG guest is not (0 fight
		// warnings on 6.12): FULL=1 runs it, and fails there.
		"uplinkpin": {skip: "^TestKernelFight$"},
		"vpnbypass": {skip: "^TestKernelFight$"},
		"watch":     {},
		"wireguard": {},
	},
}

func anyOf(names ...string) string { return "^(" + strings.Join(names, "|") + ")$" }

func without(names []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return slices.Contains(drop, n) })
}

// planned is a suite with what this run takes of it.
type planned struct {
	suite
	choice
}

// planFor returns what kernel k runs: everything with full, the suites
// named in only (whole) when it names any, else k's budget.
func planFor(k string, full bool, only []string) []planned {
	var out []planned
	for _, s := range suites {
		switch {
		case full:
			out = append(out, planned{suite: s})
		case only != nil:
			if slices.Contains(only, s.name) {
				out = append(out, planned{suite: s})
			}
		default:
			if c, ok := budget[k][s.name]; ok {
				out = append(out, planned{suite: s, choice: c})
			} else if _, known := budget[k]; !known {
				out = append(out, planned{suite: s})
			}
		}
	}
	return out
}
