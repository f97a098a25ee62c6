//go:build linux

package k8s

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newNetns adds a network namespace named msk8s-<pid>-<n><role> with lo up.
func (c *cluster) newNetns(role string) (string, error) {
	name := fmt.Sprintf("msk8s-%s-%d%s", c.id, c.next(), role)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ip netns add %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	if err := ipBatch(name, "link set lo up"); err != nil {
		exec.Command("ip", "netns", "del", name).Run()
		return "", err
	}
	return name, nil
}

// next returns a number no earlier call returned, for unique names.
func (c *cluster) next() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	return c.seq
}

func removeNetnsWithPrefix(prefix string) {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
}

// ipBatch runs `ip -n ns CMD` for each command, stopping at the first error.
func ipBatch(ns string, cmds ...string) error {
	for _, c := range cmds {
		if _, err := ipOut(ns, strings.Fields(c)...); err != nil {
			return err
		}
	}
	return nil
}

// ipOut runs `ip -n ns ARGS…` and returns its output.
func ipOut(ns string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// httpClientIn returns an HTTP client whose sockets are opened in the
// network namespace ns.
func httpClientIn(ns string, tlsConfig *tls.Config) *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext:       dialIn(ns),
			TLSClientConfig:   tlsConfig,
			DisableKeepAlives: true, // every client is short-lived
		},
	}
}

// dialIn dials from inside the named network namespace: the socket is made
// on an OS thread switched into it, then the thread is switched back. A
// socket keeps the namespace it was made in.
func dialIn(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			conn net.Conn
			err  error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			orig, err := os.Open("/proc/thread-self/ns/net")
			if err != nil {
				runtime.UnlockOSThread()
				ch <- result{nil, err}
				return
			}
			defer orig.Close()
			target, err := os.Open("/run/netns/" + ns)
			if err != nil {
				runtime.UnlockOSThread()
				ch <- result{nil, err}
				return
			}
			defer target.Close()
			if err := setns(target); err != nil {
				runtime.UnlockOSThread()
				ch <- result{nil, fmt.Errorf("setns %s: %w", ns, err)}
				return
			}
			var d net.Dialer
			conn, err := d.DialContext(ctx, network, addr)
			if serr := setns(orig); serr != nil {
				// Leave the thread locked: it exits with this goroutine
				// instead of running others in the wrong namespace.
				if conn != nil {
					conn.Close()
				}
				ch <- result{nil, fmt.Errorf("setns back: %w", serr)}
				return
			}
			runtime.UnlockOSThread()
			ch <- result{conn, err}
		}()
		r := <-ch
		return r.conn, r.err
	}
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }

// node is one Kubernetes node's network namespace with the seed topology,
// plus its gateway's namespace and a link to the API server.
type node struct {
	ns, gw string
	apiIP  string // the node's address on the apihost bridge
}

// newNode builds the seed topology in fresh namespaces:
//
//	node: enp7s0 (veth, MTU 1450) 10.0.0.5/32; 10.0.0.1 dev enp7s0 scope link;
//	      10.0.0.0/16 via 10.0.0.1 dev enp7s0 mtu 1355 (the old approach's lowered route);
//	      cilium_wg0 (tun) MTU 1355 up; k8s0 192.0.2.N/24 into the apihost bridge
//	gateway: the peer of enp7s0, 10.0.0.1/16
//
// The address is a /32 with an explicit route to the gateway, as a cloud's
// DHCP gives it, so the /16 via the gateway is the only main-table route to
// 10.0.0.9. The namespaces are removed when t ends.
func (c *cluster) newNode(t testing.TB) *node {
	t.Helper()
	ns, err := c.newNetns("node")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	gw, err := c.newNetns("gw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", gw).Run() })

	seq := c.next()
	n := &node{ns: ns, gw: gw, apiIP: fmt.Sprintf("192.0.2.%d", 10+seq%200)}
	port := fmt.Sprintf("k8sn%d", seq) // the bridge port in apihost
	if _, err := ipOut(ns, "link", "add", "enp7s0", "mtu", "1450", "type", "veth", "peer", "name", "gw0", "mtu", "1450", "netns", gw); err != nil {
		t.Fatal(err)
	}
	if _, err := ipOut(ns, "link", "add", "k8s0", "type", "veth", "peer", "name", port, "netns", c.apihost); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exec.Command("ip", "-n", c.apihost, "link", "del", port).Run() })
	err = firstErr(
		ipBatch(gw,
			"addr add 10.0.0.1/16 dev gw0",
			"link set gw0 up"),
		ipBatch(c.apihost,
			"link set "+port+" master k8sbr",
			"link set "+port+" up"),
		ipBatch(ns,
			"addr add 10.0.0.5/32 dev enp7s0",
			"link set enp7s0 up",
			"route add 10.0.0.1 dev enp7s0 scope link",
			"route add 10.0.0.0/16 via 10.0.0.1 dev enp7s0 mtu 1355",
			"tuntap add mode tun name cilium_wg0",
			"link set cilium_wg0 mtu 1355 up",
			fmt.Sprintf("addr add %s/%d dev k8s0", n.apiIP, apiPrefix),
			"link set k8s0 up"),
	)
	if err != nil {
		t.Fatal(err)
	}
	// The agent's path to the API server works before it starts.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := httpClientIn(ns, &tls.Config{InsecureSkipVerify: true})
	if err := poll(ctx, 50*time.Millisecond, func() error {
		resp, err := hc.Get("https://" + apiAddr + ":" + apiPort + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}); err != nil {
		t.Fatalf("the node namespace does not reach the API server: %v", err)
	}
	return n
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// The kernel, asked the way an operator would: `ip route get` with and
// without the encryption mark, and `ip rule`.
const peer = "10.0.0.9"

var (
	mtuRE  = regexp.MustCompile(`\bmtu (\d+)\b`)
	ruleRE = regexp.MustCompile(`(?m)^900:\s+not from all fwmark 0xe00/0xf00 lookup 900\b`)
	prefRE = regexp.MustCompile(`(?m)^900:`)
)

// routeMTU returns the MTU `ip route get` reports, or 0 when it shows none.
func routeMTU(out string) int {
	m := mtuRE.FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

// splitOn is nil when the split is in effect: unmarked packets to the peer
// use table 900 at the tunnel MTU (1355), WireGuard's marked ones do not and
// get the interface MTU (1450), and the rule is at priority 900.
func (n *node) splitOn() error {
	unmarked, err := ipOut(n.ns, "route", "get", peer)
	if err != nil {
		return err
	}
	marked, err := ipOut(n.ns, "route", "get", peer, "mark", "0xe00")
	if err != nil {
		return err
	}
	rules, err := ipOut(n.ns, "rule")
	if err != nil {
		return err
	}
	switch {
	case !strings.Contains(unmarked, "table 900") || routeMTU(unmarked) != 1355:
		return fmt.Errorf("ip route get %s: want table 900 and mtu 1355, got %q", peer, unmarked)
	case strings.Contains(marked, "table 900"):
		return fmt.Errorf("ip route get %s mark 0xe00: want the main table, got %q", peer, marked)
	case routeMTU(marked) != 1450 && routeMTU(marked) != 0:
		// No mtu shown means the route has none: the interface MTU, 1450.
		return fmt.Errorf("ip route get %s mark 0xe00: want mtu 1450, got %q", peer, marked)
	case !ruleRE.MatchString(rules):
		return fmt.Errorf("ip rule: want 900: not from all fwmark 0xe00/0xf00 lookup 900, got\n%s", rules)
	}
	return nil
}

// splitOff is nil when no split is in effect: no rule at priority 900, an
// empty table 900, and unmarked packets use the main table.
func (n *node) splitOff() error {
	unmarked, err := ipOut(n.ns, "route", "get", peer)
	if err != nil {
		return err
	}
	rules, err := ipOut(n.ns, "rule")
	if err != nil {
		return err
	}
	table, err := ipOut(n.ns, "route", "show", "table", "900")
	if err != nil && strings.Contains(err.Error(), "FIB table does not exist") {
		table, err = "", nil // never used, or emptied
	}
	if err != nil {
		return err
	}
	switch {
	case strings.Contains(unmarked, "table 900"):
		return fmt.Errorf("ip route get %s: want the main table, got %q", peer, unmarked)
	case prefRE.MatchString(rules):
		return fmt.Errorf("ip rule: want nothing at priority 900, got\n%s", rules)
	case strings.TrimSpace(table) != "":
		return fmt.Errorf("ip route show table 900: want it empty, got\n%s", table)
	}
	return nil
}

// snapshot is what the agent could edit here: the IPv4 routes of every
// table, the rules of both families and the links' MTUs. (IPv6 routes are left
// out: link-local ones come and go on their own as links come up.)
func (n *node) snapshot() (string, error) {
	var b strings.Builder
	for _, args := range [][]string{
		{"-4", "route", "show", "table", "all"},
		{"-4", "rule"},
		{"-6", "rule"},
	} {
		out, err := ipOut(n.ns, args...)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "# ip %s\n%s", strings.Join(args, " "), out)
	}
	links, err := ipOut(n.ns, "-o", "link")
	if err != nil {
		return "", err
	}
	b.WriteString("# links\n")
	for _, m := range linkMTURE.FindAllStringSubmatch(links, -1) {
		fmt.Fprintf(&b, "%s mtu %s\n", m[1], m[2])
	}
	return b.String(), nil
}

var linkMTURE = regexp.MustCompile(`(?m)^\d+: ([^:@]+)[:@].* mtu (\d+)`)
