//go:build linux

package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// One `run` per table and network namespace: a second one exits 1 with one
// line naming the first, which goes on undisturbed; once refuses beside it;
// cleanup refuses too, removing nothing, saying that the agent would put it
// back and how to stop it; plan and verify still work.
func TestKernelOneAgentPerTable(t *testing.T) {
	s := newSeed(t, true)
	a := s.start(t, append(seedArgs, "--metrics-addr=")...)
	eventually(t, 5*time.Second, "split", func() error { return s.splitAt(t, 1355) })
	eventually(t, 5*time.Second, "the agent converged", func() error { return a.logged(t, "rule 900: not fwmark 0xe00/0xf00 lookup 900") })

	holder := fmt.Sprintf("kept by another marksplit (pid %d, marksplit)", a.cmd.Process.Pid)
	for _, args := range [][]string{
		append([]string{"run", "--metrics-addr="}, seedArgs...),
		append([]string{"once"}, seedArgs...),
	} {
		stdout, stderr, code := s.command(t, args...)
		if code != 1 || !strings.Contains(stderr, "table 900 and priority 900 in this network namespace are "+holder) || strings.Count(stderr, "\n") != 1 || stdout != "" {
			t.Errorf("%s beside a running agent: exit %d, stdout %q, stderr %q; want exit 1 and one line naming it", args[0], code, stdout, stderr)
		}
	}
	// cleanup refuses, removes nothing, and says that the running agent
	// would put it back and how to stop it: no race with the agent.
	before := len(a.messages(t))
	stdout, stderr, code := s.command(t, "cleanup", "--prefix=10.0.0.0/16")
	if code != 1 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, holder) ||
		!strings.Contains(stderr, "would put back at once") || !strings.Contains(stderr, "docs/operations.md") || !strings.Contains(stderr, "kubectl -n kube-system create configmap marksplit-uninstall") {
		t.Errorf("cleanup beside a running agent: exit %d, stdout %q, stderr %q; want exit 1 and one line naming the holder, saying it would put it back and how to stop it", code, stdout, stderr)
	}
	if err := s.splitAt(t, 1355); err != nil {
		t.Errorf("after a refused cleanup: %v", err)
	}
	if stdout, stderr, code := s.command(t, append([]string{"plan"}, seedArgs...)...); code != 0 || stdout != "" {
		t.Errorf("plan beside a running agent: exit %d, stdout %q, stderr %q; want exit 0 and nothing to do", code, stdout, stderr)
	}
	if stdout, stderr, code := s.command(t, "verify", "--peer=10.0.0.9", "--prefix=10.0.0.0/16"); code != 0 {
		t.Errorf("verify beside a running agent: exit %d\n%s%s", code, stdout, stderr)
	}
	if after := a.messages(t)[before:]; len(after) != 0 {
		t.Errorf("the agent logged %q beside cleanup, plan and verify; want nothing (no change, no fight)", after)
	}
	// The first agent was not disturbed: it still repairs.
	s.ns.IP(t, "rule", "del", "pref", "900")
	eventually(t, time.Second, "the rule restored by the first agent", func() error { return s.splitAt(t, 1355) })
	if code, _ := a.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("first agent: exit %d", code)
	}
	// Its lock went with it.
	b := s.start(t, append(seedArgs, "--metrics-addr=")...)
	eventually(t, 5*time.Second, "a new agent after the first stopped", func() error {
		return b.logged(t, "marksplit dev running")
	})
}

// The underlay bounces again and again, its DHCP client adding its routes
// back each time: the kernel's own flushes are no fight, and the table is
// rebuilt after every bounce.
func TestKernelUnderlayFlapsAreNoFight(t *testing.T) {
	s := newSeed(t, true)
	a := s.start(t, append(seedArgs, "--metrics-addr=")...)
	eventually(t, 5*time.Second, "split", func() error { return s.splitAt(t, 1355) })
	for i := range 10 {
		s.ns.IP(t, "link", "set", "enp7s0", "down")
		eventually(t, time.Second, fmt.Sprintf("bounce %d: nothing left to split", i), func() error { return s.unsplit(t) })
		s.ns.IP(t, "link", "set", "enp7s0", "up")
		s.dhcp(t, true)
		eventually(t, time.Second, fmt.Sprintf("bounce %d: split again", i), func() error { return s.splitAt(t, 1355) })
	}
	for _, m := range a.messages(t) {
		if strings.Contains(m, "fight") {
			t.Errorf("the kernel's flushes were taken for a fight: %q", m)
		}
	}
}

// A long-lived program deletes the rule as fast as it can: at most a few
// warnings, each naming it by command and PID, and once it stops the rule
// is back.
func TestKernelFightNamesProgram(t *testing.T) {
	s := newSeed(t, true)
	a := s.start(t, append(seedArgs, "--metrics-addr=")...)
	eventually(t, 5*time.Second, "split", func() error { return s.splitAt(t, 1355) })
	h := s.ns.StartFighter(t, "rule del pref 900")
	pid := h.PID()
	eventually(t, 5*time.Second, "a fight warning", func() error {
		for _, m := range a.messages(t) {
			if strings.HasPrefix(m, "fight: ") {
				return nil
			}
		}
		return fmt.Errorf("no warning yet")
	})
	// The fight goes on after the warning: 20 more repairs, with no
	// second warning expected for them (checked below). While it lasts
	// they are summed up in a line every few seconds.
	summed := regexp.MustCompile(`^fight: \d+ repairs in \S+ of 1 objects undone again \(rule-add (\d+)\)`)
	repairs := func() int {
		n := 0
		for _, m := range a.messages(t) {
			if m == "rule 900: not fwmark 0xe00/0xf00 lookup 900" {
				n++
			} else if sm := summed.FindStringSubmatch(m); sm != nil {
				k, _ := strconv.Atoi(sm[1])
				n += k
			}
		}
		return n
	}
	atWarning := repairs()
	eventually(t, 10*time.Second, "20 repairs after the warning", func() error {
		if n := repairs() - atWarning; n < 20 {
			return fmt.Errorf("%d repairs after the warning", n)
		}
		return nil
	})
	h.Stop()
	eventually(t, time.Second, "the rule back after the program stopped", func() error { return s.splitAt(t, 1355) })
	warn := regexp.MustCompile(`^fight: rule 900: not fwmark 0xe00/0xf00 lookup 900 undone \d+ times in \S+ by ip\[` +
		fmt.Sprint(pid) + `\]; repairing at most every 100ms$`)
	var warnings []string
	for _, m := range a.messages(t) {
		if strings.HasPrefix(m, "fight: ") && !summed.MatchString(m) {
			warnings = append(warnings, m)
			if !warn.MatchString(m) {
				t.Errorf("warning %q does not match %v", m, warn)
			}
		}
	}
	if len(warnings) == 0 || len(warnings) > 3 {
		t.Errorf("%d fight warnings, want 1 to 3: %q", len(warnings), warnings)
	}
}

// The start line names the address the metrics listen on, as bound (a
// port 0 resolved); listening beyond loopback is warned about, loopback is
// not.
func TestKernelMetricsAddressLogged(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want *regexp.Regexp
		warn bool
	}{
		{"127.0.0.1:0", regexp.MustCompile(`"metrics_addr":"127\.0\.0\.1:[1-9][0-9]*"`), false},
		{"0.0.0.0:0", regexp.MustCompile(`"metrics_addr":"(0\.0\.0\.0|\[::\]):[1-9][0-9]*"`), true},
		{"", regexp.MustCompile(`"metrics_addr":"off"`), false},
	} {
		s := newSeed(t, true)
		a := s.start(t, append(seedArgs, "--metrics-addr="+tc.addr)...)
		eventually(t, 5*time.Second, "split", func() error { return s.splitAt(t, 1355) })
		out := a.out.String()
		if !tc.want.MatchString(out) {
			t.Errorf("--metrics-addr=%s: no %v in the log:\n%s", tc.addr, tc.want, out)
		}
		if warned := strings.Contains(out, "beyond loopback"); warned != tc.warn {
			t.Errorf("--metrics-addr=%s: warned %v, want %v:\n%s", tc.addr, warned, tc.warn, out)
		}
		a.stop(t, syscall.SIGTERM)
	}
}

// Another program flushes the agent's table of 22 routes as fast as it can:
// one fight warning, then one summary line with counts every few seconds,
// not one line per repaired route (issue 31: 13,435 lines in 60 s); once
// it stops, every route is back.
func TestKernelFlushFightSummarised(t *testing.T) {
	s := newSeed(t, true)
	a := s.start(t, append(seedArgs, "--metrics-addr=")...)
	eventually(t, 5*time.Second, "split", func() error { return s.splitAt(t, 1355) })
	for i := 1; i <= 20; i++ { // with the seed's gateway and /16: 22
		s.ns.IP(t, "route", "add", fmt.Sprintf("10.0.%d.0/24", i), "via", "10.0.0.1", "dev", "enp7s0", "proto", "dhcp")
	}
	routes := func() int {
		return strings.Count(s.ns.IP(t, "route", "show", "table", "900"), "\n")
	}
	eventually(t, 5*time.Second, "22 routes in table 900", func() error {
		if n := routes(); n != 22 {
			return fmt.Errorf("%d routes", n)
		}
		return nil
	})
	h := s.ns.StartFighter(t, "route flush table 900")
	summary := regexp.MustCompile(`^fight: \d+ repairs in \S+ of \d+ objects undone again \(route-replace \d+\); each one's line is left out while the fight lasts$`)
	eventually(t, 20*time.Second, "a summary of the repairs", func() error {
		for _, m := range a.messages(t) {
			if summary.MatchString(m) {
				return nil
			}
		}
		return fmt.Errorf("no summary line yet")
	})
	h.Stop()
	eventually(t, 5*time.Second, "22 routes back in table 900", func() error {
		if n := routes(); n != 22 {
			return fmt.Errorf("%d routes", n)
		}
		return nil
	})
	var warned bool
	var perRoute, summaries int
	for _, m := range a.messages(t) {
		switch {
		case strings.HasPrefix(m, "fight: table 900"):
			warned = true
		case warned && strings.HasPrefix(m, "table 900: "):
			perRoute++
		case summary.MatchString(m):
			summaries++
		}
	}
	t.Logf("after the fight warning: %d per-route lines, %d summaries", perRoute, summaries)
	for _, m := range a.messages(t) {
		if strings.HasPrefix(m, "fight") {
			t.Log(m)
		}
	}
	if !warned || perRoute > 2*22 {
		t.Errorf("fight warning %v, %d per-route lines after it; want a warning, then summaries instead of per-route lines", warned, perRoute)
	}
}
