//go:build linux

package main

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/internal/kerneltest"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// A hop of 1300 bytes whose router rate-limits its "fragmentation needed"
// messages: of every icmpEvery it sends, one reaches the node, the first
// held back. Linux never limits these itself (icmpv4_mask_allow: "Don't
// limit PMTU discovery"; no icmp_ratelimit or icmp_msgs_per_sec setting
// holds one back), so the test limits them on the router's way out: tc
// hands them to a tun device, and the test passes one in icmpEvery to a
// tun device on the node, where the kernel takes it as it came. With
// learning and probing on, the agent must neither miss the path nor be
// misled by the messages that never come: the peer's route goes from the
// tunnel MTU to floor16(1300 − 60) = 1232 in one step (learned from a
// message that came through, or probed, whichever comes first), and no
// raise is counted. With learning off, the search alone must find the
// same value, whatever messages come through meanwhile.
func TestKernelPathMTULearnedICMPRateLimited(t *testing.T) {
	for _, learn := range []bool{true, false} {
		name := "learned and probed"
		if !learn {
			name = "probed alone" // the messages that come through change nothing
		}
		t.Run(name, func(t *testing.T) { icmpRateLimited(t, learn) })
	}
}

func icmpRateLimited(t *testing.T, learn bool) {
	const icmpEvery = 4
	s, api := newPeerSeed(t)
	far := kerneltest.NewNetNS(t)
	far.LoUp(t)
	s.gw.AddVeth(t, "r1", far, "p0")
	s.gw.IP(t, "link", "set", "r1", "mtu", "1300", "up")
	far.IP(t, "link", "set", "p0", "mtu", "1300", "up")
	s.gw.IP(t, "addr", "add", "10.9.2.1/24", "dev", "r1")
	far.IP(t, "addr", "add", "10.9.2.2/24", "dev", "p0")
	far.IP(t, "addr", "add", "10.0.0.9/32", "dev", "p0")
	far.IP(t, "route", "add", "default", "via", "10.9.2.1")
	s.gw.IP(t, "route", "add", "10.0.0.9/32", "dev", "r1")
	if err := s.gw.Do(func() error { return writeProc("/proc/sys/net/ipv4/ip_forward", "1") }); err != nil {
		t.Fatal(err)
	}
	// The peer answers probes too: a search that can, ends "found".
	serveResponder(t, far)

	// The limiter: the router's frag-needed messages to the node go to
	// lim0 (a tun device); one in icmpEvery is written to icmp0 on the
	// node.
	s.gw.AddTun(t, "lim0")
	s.gw.IP(t, "link", "set", "lim0", "up")
	s.ns.AddTun(t, "icmp0")
	s.ns.IP(t, "link", "set", "icmp0", "up")
	for _, k := range []string{"all", "default", "icmp0"} {
		if err := s.ns.Do(func() error { return writeProc("/proc/sys/net/ipv4/conf/"+k+"/rp_filter", "0") }); err != nil {
			t.Fatal(err)
		}
	}
	tc(t, s.gw, "qdisc", "add", "dev", "gw0", "clsact")
	tc(t, s.gw, "filter", "add", "dev", "gw0", "egress", "prio", "1", "protocol", "ip", "u32",
		"match", "ip", "protocol", "1", "0xff", "match", "u8", "3", "0xff", "at", "20", "match", "u8", "4", "0xff", "at", "21",
		"action", "mirred", "egress", "redirect", "dev", "lim0")
	from, to := openTun(t, s.gw, "lim0"), openTun(t, s.ns, "icmp0")
	var seen, passed atomic.Uint64
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, err := from.Read(buf)
			if err != nil {
				return
			}
			if seen.Add(1)%icmpEvery == 0 {
				if _, err := to.Write(buf[:n]); err == nil {
					passed.Add(1)
				}
			}
		}
	})
	t.Cleanup(func() { from.Close(); wg.Wait(); to.Close() })

	a := s.startBinEnv(t, agentBinary(t), api.env, append(peerArgs, "--metrics-addr=127.0.0.1:9184", "--path-mtu-probe=true", fmt.Sprintf("--path-mtu-learn=%v", learn))...)
	// WireGuard's own full-size packets to the peer, DF set, marked, until
	// the route has its value: most of their messages are held back.
	eventually(t, 2*time.Minute, "the path MTU on the peer's route", func() error {
		if err := s.ns.Do(func() error { return sendMarkedDF(netip.MustParseAddr("10.0.0.9"), 1400, 0xe00) }); err != nil {
			return err
		}
		return s.via(t, "10.0.0.9", false, "900", 1232)
	})
	_, body, err := nsGetter(s)("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{"probed", "learned"} {
		if n := scrapedValue(body, `marksplit_path_mtu_changes_total{direction="raise",source="`+src+`"}`); n != 0 {
			t.Errorf("raises by %s: %v, want 0", src, n)
		}
	}
	// The pass logs a change after the kernel has it: wait for the line.
	var routes []string
	eventually(t, 5*time.Second, "the change to 1232 logged", func() error {
		routes = nil
		for _, m := range a.changes(t) {
			if strings.HasPrefix(m, "table 900: 10.0.0.9 ") {
				routes = append(routes, mtuOf.FindString(m))
			}
		}
		if len(routes) == 0 || routes[len(routes)-1] != "mtu 1232" {
			return fmt.Errorf("the peer's route lines: %q", routes)
		}
		return nil
	})
	if strings.Join(routes, ",") != "mtu 1355,mtu 1232" {
		t.Errorf("the peer's route went through %q, want the tunnel MTU, then 1232", routes)
	}
	if seen.Load() <= passed.Load() {
		t.Errorf("the limiter passed %d of %d messages: want fewer", passed.Load(), seen.Load())
	}
	var lines []string
	for _, m := range a.messages(t) {
		if strings.HasPrefix(m, "path MTU of peer 10.0.0.9:") {
			lines = append(lines, m)
		}
	}
	t.Logf("the router sent %d frag-needed messages, %d reached the node; searches found %v, unreachable %v; %q", seen.Load(), passed.Load(),
		scrapedValue(body, `marksplit_path_mtu_searches_total{result="found"}`), scrapedValue(body, `marksplit_path_mtu_searches_total{result="unreachable"}`), lines)
}

var mtuOf = regexp.MustCompile(`mtu \d+`)

// tc runs `tc ARGS` in ns; a kernel without clsact, u32 or mirred skips
// the test (fails it under MARKSPLIT_KERNEL_TESTS=1).
func tc(t *testing.T, ns *netwatchtest.NetNS, args ...string) {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + ns.Path(), "tc"}, args...)...).CombinedOutput()
	if err != nil {
		why := "tc " + strings.Join(args, " ") + ": " + err.Error() + ": " + strings.TrimSpace(string(out))
		if kerneltest.Required() {
			t.Fatal(why)
		}
		t.Skip(why)
	}
}

// openTun attaches to the tun device name in ns; reads and writes go
// through Go's poller, so Close ends a blocked Read.
func openTun(t *testing.T, ns *netwatchtest.NetNS, name string) *os.File {
	t.Helper()
	var f *os.File
	if err := ns.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), name)
		return nil
	}); err != nil {
		t.Fatalf("tun %s: %v", name, err)
	}
	return f
}
