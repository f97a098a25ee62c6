package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/marksplit/marksplit/internal/kubewatch"
	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// The subcommands.
const (
	cmdRun     = "run"
	cmdOnce    = "once"
	cmdPlan    = "plan"
	cmdCleanup = "cleanup"
	cmdVerify  = "verify"
	cmdHealth  = "health"
)

// The values of --encryption.
const (
	encOn   = "on"
	encOff  = "off"
	encAuto = "auto"
)

const defaultMetricsAddr = "127.0.0.1:9184"

// defaultHealthSocket is in the DaemonSet's emptyDir at /run/marksplit.
const defaultHealthSocket = "/run/marksplit/health.sock"

// defaultUninstallConfigMap is the uninstall switch's name: a ConfigMap
// that no manifest ships (docs/operations.md, "Uninstall").
const defaultUninstallConfigMap = "marksplit-uninstall"

// Defaults of --cilium-namespace and --cilium-configmap: where Cilium's Helm
// chart puts its agent's configuration.
const (
	defaultCiliumNamespace = "kube-system"
	defaultCiliumConfigMap = "cilium-config"
)

// options is a parsed command line.
type options struct {
	cmd         string
	policy      mtupolicy.Config
	encryption  string // encOn, encOff or encAuto
	nodeName    string
	metricsAddr string
	// secureMetricsAddr serves /metrics over HTTPS to the bearer tokens the API
	// server allows (empty: off); tlsCertFile and tlsKeyFile replace the
	// self-signed certificate.
	secureMetricsAddr       string
	tlsCertFile, tlsKeyFile string
	logFormat               string     // "text" or "json"
	peer                    netip.Addr // verify only
	verifyJSON              bool       // verify --json: one JSON object (verify_linux.go)
	ready                   bool       // health --ready
	allowShared             bool       // own a table or priority a known program uses
	noEvents                bool       // --events=false: no Kubernetes Events on the Node
	// uninstallConfigMap names the uninstall switch; "" for none.
	uninstallConfigMap string
	nodeCondition      string // the Node condition's type; "" for none (condition_linux.go)
	// wireguardLink is --wireguard-link (flags_mesh.go); "" for none.
	wireguardLink string
	wireguardPoll time.Duration
	// ciliumNamespace and ciliumConfigMap name Cilium's cilium-config, read
	// for encrypt-node with --encryption=auto (nodeencryption_linux.go).
	ciliumNamespace, ciliumConfigMap string
	healthSocket                     string // the probes' unix socket; "" for none (health_linux.go)
	// pathMTU holds the operator's path MTUs (--path-mtu), by prefix of
	// the peers' addresses (pathmtu_linux.go).
	pathMTU pathmtu.DeclaredList
	// pathLearn learns the peers' path MTUs from the kernel's PMTU
	// exceptions (pathlearn_linux.go).
	pathLearn bool
	// pathProbe searches the peers' path MTUs with probes and serves the
	// responder on probePort (pathprobe_linux.go).
	pathProbe bool
	probePort uint16
}

// usageError is a bad command line: the agent prints it in one line and
// exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// usage is the first line of --help after the subcommands; helpText
// follows the subcommands.
const (
	usage    = "(--peers=auto | --prefix CIDR | --underlay-link LINK | --wireguard-link LINK)"
	helpText = `marksplit keeps host traffic to the private node network at the tunnel MTU
while the tunnel's own marked packets keep the interface MTU.

One of --peers=auto, --prefix, --underlay-link or --wireguard-link is required.
--wireguard-link (a WireGuard mesh without Cilium: the device's peers) goes
alone, and needs no API. --peers=auto
(from every CiliumNode: exactly the encrypting peers) needs the Kubernetes API
and goes alone; --prefix and --underlay-link (which may be combined) do not.`
	verifyUsage = `--peer ADDR  ask the kernel for ADDR without and with the mark; exit 0
only when the split is in place (with --peers=auto: for a peer's address;
any other address must not be split)`
	healthUsage = `[--ready]  ask the running agent over --health-socket whether it is
alive and synced (--ready: whether a pass converged); exit 0 when it is`
)

// check checks the parsed command line of o.cmd, whose flags are fs.
// getenv supplies $KUBERNETES_SERVICE_HOST. A bad command line is a
// *usageError.
func (o *options) check(fs *flag.FlagSet, getenv func(string) string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := checkMesh(o, set); err != nil {
		return err
	}
	switch {
	case !o.policy.Peers && !o.policy.Mesh && len(o.policy.Prefixes) == 0 && o.policy.UnderlayLink == "":
		return usageErrorf("one of --peers=auto, --prefix, --underlay-link or --wireguard-link is required")
	case o.policy.Peers && (len(o.policy.Prefixes) > 0 || o.policy.UnderlayLink != ""):
		return usageErrorf("--peers=auto chooses what to split by itself: give it without --prefix and --underlay-link")
	}
	if len(o.pathMTU) > 0 && !o.policy.Peers && !o.policy.Mesh {
		return usageErrorf("--path-mtu sets the MTU of each peer's host route: it needs --peers=auto (or --wireguard-link: by the peer's endpoint)")
	}
	if err := o.policy.Validate(); err != nil {
		return usageErrorf("%s", strings.TrimPrefix(err.Error(), "mtupolicy: "))
	}
	for _, n := range []string{reconcile.OwnTable(o.policy.Table).Shared(), reconcile.OwnPriority(o.policy.Priority).Shared()} {
		if n != "" && !o.allowShared {
			return usageErrorf("%s: the agent would remove what is there; choose another, or add --allow-shared", n)
		}
	}
	if err := checkMetricsAddr("metrics-addr", o.metricsAddr); err != nil {
		return usageErrorf("%s", err)
	}
	if err := checkMetricsAddr("secure-metrics-addr", o.secureMetricsAddr); err != nil {
		return usageErrorf("%s", err)
	}
	if (o.tlsCertFile == "") != (o.tlsKeyFile == "") {
		return usageErrorf("--tls-cert-file and --tls-key-file go together (or neither: a self-signed certificate)")
	}
	if o.tlsCertFile != "" && o.secureMetricsAddr == "" {
		return usageErrorf("--tls-cert-file and --tls-key-file are the certificate of --secure-metrics-addr: give it too (or neither)")
	}
	if o.nodeName != "" && !(len(o.nodeName) <= 253 && nodeNameRE.MatchString(o.nodeName)) {
		return usageErrorf("--node-name %q: not a Kubernetes node name (lowercase letters, digits, '-' and '.', at most 253)", o.nodeName)
	}
	if o.uninstallConfigMap != "" {
		if err := kubewatch.ValidName(o.uninstallConfigMap); err != nil {
			return usageErrorf("--uninstall-configmap: %v (or empty for no switch)", err)
		}
	}
	if err := kubewatch.ValidName(o.ciliumNamespace); err != nil {
		return usageErrorf("--cilium-namespace: %v", err)
	}
	if err := kubewatch.ValidName(o.ciliumConfigMap); err != nil {
		return usageErrorf("--cilium-configmap: %v", err)
	}
	if err := checkNodeCondition(*o); err != nil {
		return err
	}
	if o.cmd == cmdVerify && !o.peer.IsValid() {
		return usageErrorf("verify needs --peer ADDR (an address on the split network, e.g. --peer 10.0.0.9)")
	}
	if o.readsPeers() && o.nodeName == "" {
		if getenv("KUBERNETES_SERVICE_HOST") == "" {
			// Outside a pod both are missing: say both in the one line.
			return usageErrorf("--peers=auto needs --node-name or $NODE_NAME, to tell this node from its peers, and the in-cluster API: not in a pod (no $KUBERNETES_SERVICE_HOST); run it in the agent's pod, or give --node-name, $KUBERNETES_SERVICE_HOST, $KUBERNETES_SERVICE_PORT and the token and CA in $MARKSPLIT_SERVICEACCOUNT_DIR (or use --prefix or --underlay-link)")
		}
		return usageErrorf("--peers=auto needs --node-name or $NODE_NAME, to tell this node from its peers")
	}
	if o.usesMode() && o.encryption == encAuto && o.nodeName == "" {
		return usageErrorf("--encryption=auto needs --node-name or $NODE_NAME (or use --encryption=on or off)")
	}
	return nil
}

// nodeNameRE matches a DNS-1123 subdomain, what a Kubernetes node (and its
// CiliumNode) is called.
var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// usesMode reports whether the command needs the encryption mode. cleanup
// removes everything owned whatever the mode; verify asks the kernel only.
func (o options) usesMode() bool {
	return o.cmd == cmdRun || o.cmd == cmdOnce || o.cmd == cmdPlan
}

// agentFlags defines the agent's own flags on fs (the Program's holds
// --table, --priority, --protocol, --netns, --resync and --version),
// filling o; verifyFlags and healthFlags are those of verify and health.
func agentFlags(fs *flag.FlagSet, o *options, getenv func(string) string) {
	p := &o.policy
	fs.Var((*reconcile.LinkName)(&p.TunnelLink), "tunnel-link", "the encrypting `link`; its live MTU is the MTU of the table's routes")
	fs.Var(markValue{&p.Mark, &p.Mask}, "mark", "`mark/mask` that the rule inverts (not fwmark); the mask is required, both non-zero, the mark inside the mask")
	fs.Var((*reconcile.Prefixes)(&p.Prefixes), "prefix", "`CIDR` (repeatable): split main-table routes equal to or inside it")
	fs.Var((*reconcile.LinkName)(&p.UnderlayLink), "underlay-link", "split main-table routes out of this `link` (never the default route)")
	fs.Var(peersValue{&p.Peers}, "peers", "`auto`: give exactly the encrypting peer nodes (from every CiliumNode) the tunnel MTU, per InternalIP, through the main table's path to each; needs the API (empty: not set)")
	o.encryption = encAuto
	fs.Var(enumValue{&o.encryption, []string{encOn, encOff, encAuto}}, "encryption", "`mode`: on, off, or auto (on while cilium-config's encrypt-node is true and the node's CiliumNode has a non-zero key; else the agent stands down)")
	fs.StringVar(&o.ciliumNamespace, "cilium-namespace", defaultCiliumNamespace, "`namespace` of Cilium's cilium-config, read with --encryption=auto")
	fs.StringVar(&o.ciliumConfigMap, "cilium-configmap", defaultCiliumConfigMap, "`name` of Cilium's ConfigMap whose encrypt-node says whether node encryption is on, read with --encryption=auto")
	fs.StringVar(&o.nodeName, "node-name", getenv("NODE_NAME"), "this node's CiliumNode: read with --encryption=auto, not a peer with --peers=auto (default $NODE_NAME)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", defaultMetricsAddr, "`address` for Prometheus /metrics, /healthz and /readyz with run, over plain HTTP to anyone; empty disables")
	fs.StringVar(&o.secureMetricsAddr, "secure-metrics-addr", "", "`address` (such as :9185) for /metrics over HTTPS with run, to the bearer tokens the Kubernetes API server allows get on /metrics; empty disables")
	fs.StringVar(&o.tlsCertFile, "tls-cert-file", "", "PEM certificate `file` for --secure-metrics-addr, read again when it changes (default: a self-signed one made at start)")
	fs.StringVar(&o.tlsKeyFile, "tls-key-file", "", "PEM private key `file` of --tls-cert-file")
	fs.StringVar(&o.uninstallConfigMap, "uninstall-configmap", defaultUninstallConfigMap, "`name` of the uninstall switch: while a ConfigMap of this name exists in the pod's namespace ($POD_NAMESPACE), run, once and plan behave as --encryption=off; read only in a pod; empty disables")
	o.logFormat = "text"
	fs.Var(enumValue{&o.logFormat, []string{"text", "json"}}, "log-format", "log `format`: text or json")
	fs.BoolVar(&o.allowShared, "allow-shared", false, "own --table or --priority even where Cilium (tables 200-202, 2004, 2005; priorities 1, 8-10, 20, 100, 109-112) or Tailscale (table 52; priorities 5210-5270) keep theirs")
	fs.Var(offValue{&o.noEvents}, "events", "record Kubernetes Events on the Node with run (a fight, failing passes, mode changes, the split installed or removed); needs the API from a pod and $NODE_NAME, else there are none; false disables")
	fs.StringVar(&o.nodeCondition, "node-condition", "", "`type` of a condition run sets on its own Node: True when the split is in place or not needed, False with a reason (e.g. MarkSplitReady); needs the API from a pod and $NODE_NAME; empty disables")
	fs.StringVar(&o.healthSocket, "health-socket", defaultHealthSocket, "unix `socket` that `marksplit health` (the kubelet's exec probes) asks with run; its directory is made 0700 and must be root's; empty disables")
	fs.Var(&o.pathMTU, "path-mtu", "`CIDR=BYTES` (repeatable): the path to the peers inside CIDR carries packets of BYTES (the longest prefix wins); their host routes get the inner MTU that leaves for WireGuard, floor16(BYTES-60) on IPv4, floor16(BYTES-80) on IPv6, never above the tunnel's; with --peers=auto")
	meshFlags(fs, o)
	fs.BoolVar(&o.pathProbe, "path-mtu-probe", false, "with --peers=auto and run: search each peer's path MTU with DF probes carrying --mark (node-wide 20 packets/s) and answer the other nodes' probes on --path-mtu-probe-port; the DaemonSet turns it on")
	fs.Func("path-mtu-probe-port", "UDP `port` of the probe responder on every node (default 9186)", func(s string) error {
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil || n == 0 {
			return errors.New("want a port from 1 to 65535")
		}
		o.probePort = uint16(n)
		return nil
	})
	fs.BoolVar(&o.pathLearn, "path-mtu-learn", true, "with --peers=auto and run: learn each peer's path MTU from the PMTU exceptions the kernel records from ICMP (read when the ICMP counters rise; kernel >= 5.3); false disables")
}

func verifyFlags(fs *flag.FlagSet, o *options) {
	fs.Var(addrValue{&o.peer}, "peer", "`address` to ask the kernel about (verify)")
	fs.BoolVar(&o.verifyJSON, "json", false, "print one JSON object (the answers, the peer's path MTU, the verdict) instead of lines (verify)")
}

func healthFlags(fs *flag.FlagSet, o *options) {
	fs.BoolVar(&o.ready, "ready", false, "ask whether a pass converged (readiness), not whether the agent is alive and synced (health)")
}

// markValue is --mark: MARK or MARK/MASK, each decimal or 0x-hex. A mark
// without a mask matches all 32 bits.
type markValue struct{ mark, mask *netwatch.Mark }

func (v markValue) String() string {
	if v.mark == nil {
		return ""
	}
	return v.mark.String() + "/" + v.mask.String()
}

// Set parses MARK/MASK as reconcile.MarkMask does.
func (v markValue) Set(s string) error {
	var m reconcile.MarkMask
	if err := m.Set(s); err != nil {
		return err
	}
	*v.mark, *v.mask = m.Mark, m.Mask
	return nil
}

// checkMetricsAddr checks the address of --name as net.Listen("tcp")
// will take it: HOST:PORT with a numeric port and, when a host is given,
// an IP address or localhost (a name would be resolved to who knows what).
func checkMetricsAddr(name, a string) error {
	if a == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("--%s %q: want HOST:PORT such as 127.0.0.1:9184 (or empty to disable)", name, a)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 && port != "0" {
		return fmt.Errorf("--%s %q: port %q is not a number from 0 to 65535", name, a, port)
	}
	if _, err := netip.ParseAddr(host); err != nil && host != "" && host != "localhost" {
		return fmt.Errorf("--%s %q: host %q is not an IP address", name, a, host)
	}
	return nil
}

// loopbackOnly reports whether a valid --metrics-addr listens on loopback
// alone.
func loopbackOnly(a string) bool {
	host, _, _ := net.SplitHostPort(a)
	ip, err := netip.ParseAddr(host)
	return host == "localhost" || err == nil && ip.IsLoopback()
}

type enumValue struct {
	v       *string
	choices []string
}

func (e enumValue) String() string {
	if e.v == nil {
		return ""
	}
	return *e.v
}

func (e enumValue) Set(s string) error {
	for _, c := range e.choices {
		if s == c {
			*e.v = s
			return nil
		}
	}
	return fmt.Errorf("want %s", strings.Join(e.choices, ", "))
}

// offValue is a boolean flag, default true, that sets *off when false.
type offValue struct{ off *bool }

func (v offValue) IsBoolFlag() bool { return true }

func (v offValue) String() string { return strconv.FormatBool(v.off == nil || !*v.off) }

func (v offValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("want true or false")
	}
	*v.off = !b
	return nil
}

type addrValue struct{ a *netip.Addr }

func (v addrValue) String() string {
	if v.a == nil || !v.a.IsValid() {
		return ""
	}
	return v.a.String()
}

func (v addrValue) Set(s string) error {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return fmt.Errorf("want an IP address such as 10.0.0.9")
	}
	*v.a = a.Unmap()
	return nil
}
