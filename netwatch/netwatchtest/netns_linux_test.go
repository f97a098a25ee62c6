//go:build linux

package netwatchtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

type ipLink struct {
	Index    uint32   `json:"ifindex"`
	Name     string   `json:"ifname"`
	Flags    []string `json:"flags"`
	LinkInfo struct {
		Kind string `json:"info_kind"`
	} `json:"linkinfo"`
}

// linkDump is a dump request for every link.
func linkDump() netlink.Message {
	b, err := (&rtnetlink.LinkMessage{}).MarshalBinary()
	if err != nil {
		panic(err)
	}
	return netlink.Message{Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request | netlink.Dump}, Data: b}
}

func linkNames(t *testing.T, ns *NetNS) []string {
	t.Helper()
	var links []ipLink
	ns.IPJSON(t, &links, "-d", "link", "show")
	var names []string
	for _, l := range links {
		names = append(names, l.Name+"/"+l.LinkInfo.Kind)
	}
	return names
}

func TestKernelNetNS(t *testing.T) {
	a, b := NewNetNS(t), NewNetNS(t)
	if a.FD() <= 0 || a.Path() == b.Path() || !strings.HasSuffix(a.Path(), "/ns/net") {
		t.Fatalf("namespaces %d %q and %q", a.FD(), a.Path(), b.Path())
	}
	if got := linkNames(t, a); !slices.Equal(got, []string{"lo/"}) {
		t.Fatalf("a fresh namespace has %v, want lo alone", got)
	}
	a.AddVeth(t, "va", b, "vb")
	a.AddTun(t, "cilium_wg0")
	a.LoUp(t)
	if got := linkNames(t, a); !slices.Equal(got, []string{"lo/", "va/veth", "cilium_wg0/tun"}) {
		t.Errorf("links of a: %v", got)
	}
	if got := linkNames(t, b); !slices.Equal(got, []string{"lo/", "vb/veth"}) {
		t.Errorf("links of b: %v", got)
	}
	var lo []ipLink
	a.IPJSON(t, &lo, "link", "show", "dev", "lo")
	if !slices.Contains(lo[0].Flags, "UP") {
		t.Errorf("lo flags %v, want UP", lo[0].Flags)
	}
	if idx := a.LinkIndex(t, "cilium_wg0"); idx != 3 {
		t.Errorf("cilium_wg0 has index %d, want 3", idx)
	}

	// Netlink reaches the namespace through its handle, and from inside Do.
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: b.FD()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs, err := c.Execute(linkDump())
	if err != nil || len(msgs) != 2 {
		t.Errorf("dump of b through its handle: %d links, %v", len(msgs), err)
	}
	err = a.Do(func() error {
		c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		msgs, err := c.Execute(linkDump())
		if len(msgs) != 3 {
			t.Errorf("dump inside a: %d links, want 3", len(msgs))
		}
		return err
	})
	if err != nil {
		t.Error(err)
	}
}

func TestKernelNetNSCleanup(t *testing.T) {
	var path string
	t.Run("use", func(t *testing.T) {
		ns := NewNetNS(t)
		ns.AddTun(t, "tun0")
		path = ns.Path()
		if _, err := os.Stat(path); err != nil {
			t.Fatal(err)
		}
	})
	// The thread that held the namespace ends right after the test; the
	// runtime reaps it asynchronously, so poll with a deadline.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := os.Stat(path)
		if os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after the test: %v, want it gone", path, err)
		}
		runtime.Gosched()
	}
}

// TestKernelNetNSNamed: a named namespace is the one ip -n NAME reaches,
// and its name is gone when the test ends.
func TestKernelNetNSNamed(t *testing.T) {
	RequireKernel(t)
	name := fmt.Sprintf("netwatchtest-%d", os.Getpid())
	t.Run("named", func(t *testing.T) {
		ns := NewNetNS(t)
		ns.Named(t, name)
		ns.IP(t, "link", "add", "named0", "type", "veth", "peer", "name", "named1")
		out, err := exec.Command("ip", "-n", name, "-o", "link", "show", "named0").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "named0") {
			t.Fatalf("ip -n %s link show named0: %v: %s", name, err, out)
		}
	})
	if _, err := os.Stat("/run/netns/" + name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/run/netns/%s after the test: %v, want it gone", name, err)
	}
}
