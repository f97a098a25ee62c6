//go:build linux

package main

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The path to a probed peer gets larger, then smaller again, on a real
// kernel. The black hole of TestKernelPathMTUProbedBlackHole gives the
// peer's route 1232; then the hole opens (the path carries the full 1415
// bytes) and a search finds it, but one measurement raises nothing: the
// route keeps 1232 and no raise is counted (raising needs two agreeing
// searches minutes apart: TestStoreRaiseOnlyAfterAgreement). Then the hole
// closes to 1280 bytes (1284 pass): the next search lowers the route at
// once to floor16(1284 − 60) = 1216. Each search is caused by a change of
// the main path to the peer (a route to it through a second gateway
// address, then that route gone), as the agent's scheduler does.
func TestKernelPathMTURaisedAndLoweredAgain(t *testing.T) {
	s, api := newPeerSeed(t)
	mid, _, _ := holeBehindGateway(t, s)
	s.ns.IP(t, "link", "set", "dev", "enp7s0", "gso_max_segs", "1")
	s.gw.IP(t, "addr", "add", "10.0.0.2/16", "dev", "gw0")
	s.ns.IP(t, "route", "add", "10.0.0.2", "dev", "enp7s0", "proto", "dhcp", "scope", "link", "src", "10.0.0.5")
	a := s.startBinEnv(t, agentBinary(t), api.env, append(peerArgs, "--metrics-addr=127.0.0.1:9184", "--path-mtu-probe=true", "--path-mtu-learn=false")...)
	get := nsGetter(s)
	metric := func(series string) float64 {
		t.Helper()
		_, body, err := get("/metrics")
		if err != nil {
			t.Fatalf("/metrics: %v", err)
		}
		return scrapedValue(body, series)
	}
	const found = `marksplit_path_mtu_searches_total{result="found"}`
	eventually(t, 2*time.Minute, "the probed path MTU on the peer's route", func() error {
		return s.via(t, "10.0.0.9", false, "900", 1232)
	})
	eventually(t, 5*time.Second, "the first search counted", func() error {
		if n := metric(found); n != 1 {
			return fmt.Errorf("%s = %v, want 1", found, n)
		}
		return nil
	})

	// The hole opens; the main path to the peer changes: a search.
	mid.IP(t, "link", "set", "m0", "mtu", "1450")
	s.ns.IP(t, "route", "add", "10.0.0.9/32", "via", "10.0.0.2", "dev", "enp7s0", "src", "10.0.0.5")
	eventually(t, 2*time.Minute, "a second search", func() error {
		if n := metric(found); n < 2 {
			return fmt.Errorf("%s = %v, want 2", found, n)
		}
		return nil
	})
	if err := s.via(t, "10.0.0.9", false, "900", 1232); err != nil {
		t.Errorf("one search of the opened path raised the route: %v", err)
	}
	for _, src := range []string{"probed", "learned", "declared"} {
		if n := metric(`marksplit_path_mtu_changes_total{direction="raise",source="` + src + `"}`); n != 0 {
			t.Errorf("raises by %s: %v, want 0", src, n)
		}
	}

	// The hole closes to 1280; the main path changes back: a search.
	mid.IP(t, "link", "set", "m0", "mtu", "1280")
	s.ns.IP(t, "route", "del", "10.0.0.9/32", "via", "10.0.0.2")
	eventually(t, 2*time.Minute, "the lower path MTU on the peer's route", func() error {
		return s.via(t, "10.0.0.9", false, "900", 1216)
	})
	if n := metric(`marksplit_path_mtu_changes_total{direction="lower",source="probed"}`); n != 2 {
		t.Errorf("lowerings by probes: %v, want 2 (1232, then 1216)", n)
	}
	var lines []string
	for _, m := range a.messages(t) {
		if strings.HasPrefix(m, "path MTU of peer 10.0.0.9:") {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[1], "(inner MTU 1216, reduced), probed") {
		t.Errorf("the peer's path-MTU log lines: %q, want two, the second at inner MTU 1216", lines)
	}
	t.Logf("%d searches found a value; %q", int(metric(found)), lines)
}

// scrapedValue is the value of series (name{labels} as /metrics prints it)
// in body, or -1 when it is not there.
func scrapedValue(body, series string) float64 {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			return f
		}
	}
	return -1
}
