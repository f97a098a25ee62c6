//go:build linux

package main

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/wgpeers"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestParseArgs(t *testing.T) {
	def := mtupolicy.DefaultConfig()
	withPrefix := def
	withPrefix.Prefixes = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}
	withPeers := def
	withPeers.Peers = true
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want options
	}{
		{
			name: "run is the default command",
			args: []string{"--prefix=10.0.0.0/16"},
			env:  map[string]string{"NODE_NAME": "worker-1"},
			want: options{cmd: cmdRun, policy: withPrefix, encryption: encAuto, nodeName: "worker-1",
				metricsAddr: "127.0.0.1:9184", logFormat: "text", uninstallConfigMap: defaultUninstallConfigMap, healthSocket: defaultHealthSocket},
		},
		{
			name: "every flag",
			args: []string{"once", "--tunnel-link", "wg1", "--mark", "0x1e00/0x1f00", "--table=1000",
				"--priority", "1001", "--prefix", "10.0.0.0/16", "--prefix=fd00::/8", "--underlay-link", "eth0",
				"--encryption=on", "--node-name", "n1", "--protocol", "static", "--metrics-addr=", "--log-format=json", "--uninstall-configmap=off.switch", "--health-socket=/run/x/h.sock"},
			want: options{cmd: cmdOnce, policy: mtupolicy.Config{
				TunnelLink: "wg1", Mark: 0x1e00, Mask: 0x1f00, Table: 1000, Priority: 1001,
				Protocol: netwatch.ProtoStatic, UnderlayLink: "eth0", Repair: true,
				Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("fd00::/8")},
			}, encryption: encOn, nodeName: "n1", logFormat: "json", uninstallConfigMap: "off.switch", healthSocket: "/run/x/h.sock"},
		},
		{
			name: "another uninstall switch, or none",
			args: []string{"--prefix=10.0.0.0/16", "--uninstall-configmap=", "--encryption=on"},
			want: options{cmd: cmdRun, policy: withPrefix, encryption: encOn, metricsAddr: defaultMetricsAddr, logFormat: "text", healthSocket: defaultHealthSocket},
		},
		{
			name: "every bit of a mark, said so; a numeric protocol",
			args: []string{"plan", "--underlay-link=enp7s0", "--mark=7/0xffffffff", "--protocol=200", "--encryption=off"},
			want: func() options {
				p := def
				p.UnderlayLink, p.Mark, p.Mask, p.Protocol = "enp7s0", 7, 0xffffffff, 200
				return options{cmd: cmdPlan, policy: p, encryption: encOff, metricsAddr: defaultMetricsAddr, logFormat: "text", uninstallConfigMap: defaultUninstallConfigMap, healthSocket: defaultHealthSocket}
			}(),
		},
		{
			name: "Cilium's table and priority, shared on purpose",
			args: []string{"plan", "--underlay-link=enp7s0", "--table=2004", "--priority=100", "--allow-shared", "--encryption=off"},
			want: func() options {
				p := def
				p.UnderlayLink, p.Table, p.Priority = "enp7s0", 2004, 100
				return options{cmd: cmdPlan, policy: p, encryption: encOff, metricsAddr: defaultMetricsAddr, logFormat: "text", allowShared: true, uninstallConfigMap: defaultUninstallConfigMap, healthSocket: defaultHealthSocket}
			}(),
		},
		{
			name: "verify and cleanup need no node name in auto mode",
			args: []string{"verify", "--peer", "10.0.0.9", "--prefix=10.0.0.0/16"},
			want: options{cmd: cmdVerify, policy: withPrefix, encryption: encAuto, metricsAddr: defaultMetricsAddr,
				logFormat: "text", peer: netip.MustParseAddr("10.0.0.9"), uninstallConfigMap: defaultUninstallConfigMap, healthSocket: defaultHealthSocket},
		},
		{
			name: "peers",
			args: []string{"--peers=auto"},
			env:  map[string]string{"NODE_NAME": "worker-1"},
			want: options{cmd: cmdRun, policy: withPeers, encryption: encAuto, nodeName: "worker-1",
				metricsAddr: "127.0.0.1:9184", logFormat: "text", uninstallConfigMap: defaultUninstallConfigMap, healthSocket: defaultHealthSocket},
		},
		{
			name: "peers with the mode off read no API, so need no node name",
			args: []string{"once", "--peers=auto", "--encryption=off"},
			want: options{cmd: cmdOnce, policy: withPeers, encryption: encOff, metricsAddr: defaultMetricsAddr, logFormat: "text", uninstallConfigMap: defaultUninstallConfigMap, healthSocket: defaultHealthSocket},
		},
		{
			name: "cleanup with peers needs no node name",
			args: []string{"cleanup", "--peers", "auto"},
			want: options{cmd: cmdCleanup, policy: withPeers, encryption: encAuto, metricsAddr: defaultMetricsAddr, logFormat: "text", uninstallConfigMap: defaultUninstallConfigMap, healthSocket: defaultHealthSocket},
		},
		{
			name: "a WireGuard mesh: the device names the link, auto is on, nothing is repaired",
			args: []string{"once", "--wireguard-link=wg0", "--wireguard-poll=250ms"},
			want: func() options {
				p := mtupolicy.DefaultConfig()
				p.Mesh, p.TunnelLink, p.Repair = true, "wg0", false
				return options{cmd: cmdOnce, policy: p, encryption: encOn, metricsAddr: defaultMetricsAddr, logFormat: "text",
					uninstallConfigMap: defaultUninstallConfigMap, healthSocket: defaultHealthSocket, wireguardLink: "wg0", wireguardPoll: 250 * time.Millisecond}
			}(),
		},
		{
			name: "cleanup",
			args: []string{"cleanup", "--prefix=10.0.0.0/16"},
			want: options{cmd: cmdCleanup, policy: withPrefix, encryption: encAuto, metricsAddr: defaultMetricsAddr, logFormat: "text", uninstallConfigMap: defaultUninstallConfigMap, healthSocket: defaultHealthSocket},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseArgs(tt.args, env(tt.env), new(bytes.Buffer))
			if err != nil {
				t.Fatalf("parseArgs(%q): %v", tt.args, err)
			}
			if tt.want.ciliumNamespace == "" { // the defaults, in every case
				tt.want.ciliumNamespace, tt.want.ciliumConfigMap = defaultCiliumNamespace, defaultCiliumConfigMap
			}
			if tt.want.wireguardPoll == 0 {
				tt.want.wireguardPoll = wgpeers.DefaultInterval
			}
			tt.want.pathLearn = true // --path-mtu-learn's default; no case turns it off
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(options{}), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
				cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("parseArgs(%q) (-want +got):\n%s", tt.args, diff)
			}
		})
	}
}

// Bad command lines exit 2 with exactly one line on stderr that says what
// is wrong, and nothing on stdout.
func TestBadFlagsExit2(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // outside a pod
	tests := []struct {
		args []string
		want string // in the one line
	}{
		{nil, "one of --peers=auto, --prefix, --underlay-link or --wireguard-link is required"},
		{[]string{"once"}, "one of --peers=auto, --prefix, --underlay-link or --wireguard-link is required"},
		{[]string{"--peers="}, "one of --peers=auto, --prefix, --underlay-link or --wireguard-link is required"},
		{[]string{"--peers=yes"}, `invalid value "yes" for flag --peers: want auto`},
		{[]string{"--wireguard-link=wg0", "--peers=auto"}, "--wireguard-link reads what to split, the link and the mark from the WireGuard device: give it without --peers"},
		{[]string{"--wireguard-link=wg0", "--prefix=10.0.0.0/16"}, "give it without --prefix"},
		{[]string{"--wireguard-link=wg0", "--underlay-link=enp7s0"}, "give it without --underlay-link"},
		{[]string{"--wireguard-link=wg0", "--tunnel-link=wg1"}, "give it without --tunnel-link"},
		{[]string{"--wireguard-link=wg0", "--mark=0x1e00/0xffffffff"}, "give it without --mark"},
		{[]string{"--wireguard-link=wg0", "--wireguard-poll=10ms"}, "--wireguard-poll 10ms: at least 100ms"},
		{[]string{"--prefix=10.0.0.0/16", "--wireguard-poll=1s", "--encryption=on"}, "--wireguard-poll goes with --wireguard-link"},
		{[]string{"verify", "--wireguard-link=wg0", "--peer=10.244.9.1"}, "verify does not know the --wireguard-link device's fwmark yet"},
		{[]string{"--peers=auto", "--prefix=10.0.0.0/16", "--node-name=n1"}, "--peers=auto chooses what to split by itself: give it without --prefix and --underlay-link"},
		{[]string{"once", "--peers=auto", "--underlay-link=enp7s0", "--encryption=on"}, "give it without --prefix and --underlay-link"},
		{[]string{"--peers=auto", "--encryption=on"}, "--peers=auto needs --node-name or $NODE_NAME, to tell this node from its peers"},
		{[]string{"verify", "--peers=auto", "--peer=10.0.0.9"}, "--peers=auto needs --node-name or $NODE_NAME, to tell this node from its peers, and the in-cluster API: not in a pod (no $KUBERNETES_SERVICE_HOST)"},
		{[]string{"--prefix=10.0.0.0/16", "--cilium-namespace=Kube_System", "--encryption=on"}, `--cilium-namespace: invalid name "Kube_System"`},
		{[]string{"--prefix=10.0.0.0/16", "--cilium-namespace=", "--encryption=on"}, "--cilium-namespace: invalid name"},
		{[]string{"--prefix=10.0.0.0/16", "--cilium-configmap=cilium config", "--encryption=on"}, `--cilium-configmap: invalid name "cilium config"`},
		{[]string{"--prefix=10.0.0.0/16", "--table=0", "--encryption=on"}, "table 0 is reserved"},
		{[]string{"--prefix=10.0.0.0/16", "--table=253", "--encryption=on"}, "table 253 is reserved"},
		{[]string{"--prefix=10.0.0.0/16", "--table=254", "--encryption=on"}, "table 254 is reserved"},
		{[]string{"--prefix=10.0.0.0/16", "--table=255", "--encryption=on"}, "table 255 is reserved"},
		{[]string{"--prefix=10.0.0.0/16", "--priority=0", "--encryption=on"}, "priority 0 is the kernel's local rule"},
		{[]string{"--prefix=10.0.0.0/16", "--priority=32766", "--encryption=on"}, "priority 32766 is at or after the main table's rule (32766)"},
		{[]string{"--prefix=10.0.0.0/16", "--priority=32767", "--encryption=on"}, "priority 32767 is at or after the main table's rule (32766)"},
		{[]string{"--prefix=10.0.0.0/16", "--priority=40000", "--encryption=on"}, "priority 40000 is at or after the main table's rule (32766)"},
		{[]string{"--prefix=10.0.0.5/16"}, `invalid value "10.0.0.5/16" for flag --prefix: host bits set (did you mean 10.0.0.0/16?)`},
		{[]string{"--prefix=10.0.0/16"}, `invalid value "10.0.0/16" for flag --prefix: not a CIDR prefix`},
		{[]string{"--prefix=10.0.0.0/16", "--mark=0xe00/0x100", "--encryption=on"}, "mask 0x100 does not cover mark 0xe00"},
		{[]string{"--prefix=10.0.0.0/16", "--mark=wg"}, `invalid value "wg" for flag --mark: not MARK/MASK`},
		{[]string{"--prefix=10.0.0.0/16", "--tunnel-link=a b"}, `invalid value "a b" for flag --tunnel-link: "a b" is not a name the kernel accepts for a link`},
		{[]string{"--prefix=10.0.0.0/16", "--tunnel-link=a/b"}, `invalid value "a/b" for flag --tunnel-link: "a/b" is not a name the kernel accepts`},
		{[]string{"--underlay-link=eth\x1b0"}, `for flag --underlay-link: "eth\x1b0": a link name with control characters is refused`},
		{[]string{"--underlay-link=averyveryverylongname"}, "longer than 15 bytes"},
		{[]string{"--prefix=10.0.0.0/16", "--priority=abc"}, `invalid value "abc" for flag --priority: not a rule priority (1 to 32765)`},
		{[]string{"--prefix=10.0.0.0/16", "--table=252"}, "table 252 is reserved"},
		{[]string{"--prefix=10.0.0.0/16", "--table=2004", "--encryption=on"}, "Cilium's table 2004: the agent would remove what is there; choose another, or add --allow-shared"},
		{[]string{"plan", "--prefix=10.0.0.0/16", "--priority=100", "--encryption=on"}, "Cilium's rule priority 100"},
		{[]string{"--prefix=10.0.0.0/16", "--table=52", "--encryption=on"}, "Tailscale's table 52"},
		{[]string{"--prefix=10.0.0.0/16", "--priority=5210", "--encryption=on"}, "Tailscale's rule priority 5210"},
		{[]string{"--prefix=10.0.0.0/16", "--mark=0xe00"}, `invalid value "0xe00" for flag --mark: 0xe00 has no mask: a bare mark matches all 32 bits`},
		{[]string{"--prefix=10.0.0.0/16", "--encryption=on", "--metrics-addr=9184"}, `--metrics-addr "9184": want HOST:PORT`},
		{[]string{"plan", "--prefix=10.0.0.0/16", "--encryption=on", "--metrics-addr=127.0.0.1:http"}, `port "http" is not a number`},
		{[]string{"cleanup", "--prefix=10.0.0.0/16", "--metrics-addr=node1:9184"}, `host "node1" is not an IP address`},
		{[]string{"verify", "--prefix=10.0.0.0/16", "--peer=10.0.0.9", "--metrics-addr=127.0.0.1:99999"}, `port "99999" is not a number from 0 to 65535`},
		{[]string{"--prefix=10.0.0.0/16", "--encryption=on", "--secure-metrics-addr=9185"}, `--secure-metrics-addr "9185": want HOST:PORT`},
		{[]string{"--prefix=10.0.0.0/16", "--encryption=on", "--secure-metrics-addr=:9185", "--tls-cert-file=/c"}, "--tls-cert-file and --tls-key-file go together"},
		{[]string{"--prefix=10.0.0.0/16", "--encryption=on", "--tls-cert-file=/c", "--tls-key-file=/k"}, "--tls-cert-file and --tls-key-file are the certificate of --secure-metrics-addr: give it too (or neither)"},
		{[]string{"--prefix=10.0.0.0/16", "--encryption=on", "--secure-metrics-addr=", "--tls-cert-file=/c", "--tls-key-file=/k"}, "are the certificate of --secure-metrics-addr"},
		{[]string{"--prefix=10.0.0.0/16", "--node-name=Node_1"}, `--node-name "Node_1": not a Kubernetes node name`},
		{[]string{"--prefix=10.0.0.0/16", "--table=main"}, `invalid value "main" for flag --table`},
		{[]string{"--prefix=10.0.0.0/16", "--encryption=yes"}, `invalid value "yes" for flag --encryption: want on, off, auto`},
		{[]string{"--prefix=10.0.0.0/16", "--log-format=xml"}, `invalid value "xml" for flag --log-format: want text, json`},
		{[]string{"--prefix=10.0.0.0/16", "--protocol=3", "--encryption=on"}, "protocol 3 means something to the kernel"},
		{[]string{"--prefix=10.0.0.0/16", "--protocol=nope"}, `invalid value "nope" for flag --protocol`},
		{[]string{"--prefix=10.0.0.0/16", "--frobnicate"}, "flag provided but not defined: --frobnicate"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--prefix=10.0.0.0/16", "once"}, `unexpected argument "once": the command comes first`},
		{[]string{"verify", "--prefix=10.0.0.0/16"}, "verify needs --peer ADDR"},
		{[]string{"verify", "--prefix=10.0.0.0/16", "--peer=10.0.0.0/16"}, `invalid value "10.0.0.0/16" for flag --peer`},
		{[]string{"once", "--prefix=10.0.0.0/16", "--peer=10.0.0.9"}, "flag provided but not defined: --peer"},
		{[]string{"run", "--prefix=10.0.0.0/16"}, "--encryption=auto needs --node-name or $NODE_NAME"},
		{[]string{"--underlay-link=cilium_wg0", "--encryption=on"}, `underlay link "cilium_wg0" is the tunnel link`},
		{[]string{"--prefix=10.0.0.0/16", "--encryption=on", "--uninstall-configmap=Off_Switch"}, `--uninstall-configmap: invalid name "Off_Switch": not a DNS subdomain`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != exitUsage {
				t.Errorf("exit code %d, want %d", code, exitUsage)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout: %q, want nothing", stdout.String())
			}
			out := stderr.String()
			if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
				t.Fatalf("stderr is not one line: %q", out)
			}
			if !strings.HasPrefix(out, "marksplit: ") || !strings.Contains(out, tt.want) {
				t.Errorf("stderr: %q, want \"marksplit: …%s…\"", out, tt.want)
			}
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"once", "-h"}, {"help"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != exitOK {
			t.Errorf("%q: exit code %d, want 0", args, code)
		}
		if !strings.Contains(stdout.String(), "\n  verify   --peer ADDR  ") || !strings.Contains(stdout.String(), "\n  --ready\n") || !strings.Contains(stdout.String(), "\n  --underlay-link link\n") {
			t.Errorf("%q: stdout lacks the usage:\n%s", args, stdout.String())
		}
		if stderr.Len() != 0 {
			t.Errorf("%q: stderr: %q", args, stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--version"}, &stdout, &stderr); code != exitOK || stdout.String() != "marksplit dev\n" {
		t.Errorf("--version: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}
