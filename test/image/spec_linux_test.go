//go:build linux

package image

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
)

// containerdDefaultCaps are the capabilities containerd gives a container
// before its securityContext adds or drops any (pkg/oci defaultUnixCaps).
var containerdDefaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// run is one container to run: what the pod says, where, and what the test
// changes on purpose.
type run struct {
	pod      pod
	image    imageConfig
	args     []string // the container's args, expanded
	env      []string // the container's env, expanded
	netns    string   // path of the network namespace a hostNetwork pod shares
	mounts   []specs.Mount
	withCaps func(*corev1.Capabilities) // edits the manifest's capabilities (negative tests)
	writable bool                       // a writable root in spite of the manifest (a negative control)
	noSecc   bool                       // no seccomp in spite of the manifest (a negative control)
	process  []string                   // replaces the image's entrypoint and the args (the probe)
}

// runtimeSpec returns the OCI runtime config that containerd 2.x's CRI
// plugin writes for r's container: the kubelet's command line (entrypoint +
// args), the securityContext's user, capability sets, no-new-privileges,
// read-only root and seccomp profile, the pod's network namespace and the
// container's resource limits, on containerd's default mounts, masked and
// read-only paths. What it does not model it refuses, so that a manifest
// change it cannot follow fails the test instead of being ignored.
func runtimeSpec(r run) (*specs.Spec, error) {
	c := r.pod.container
	sc := c.SecurityContext
	if sc == nil {
		return nil, fmt.Errorf("container %s has no securityContext", c.Name)
	}
	if sc.Privileged != nil && *sc.Privileged {
		return nil, fmt.Errorf("privileged containers are not modelled")
	}
	if len(c.Command) != 0 {
		return nil, fmt.Errorf("command %q: only args are modelled", c.Command)
	}
	if !r.pod.hostNetwork {
		return nil, fmt.Errorf("only hostNetwork pods are modelled")
	}
	uid, gid, err := imageUser(r.image.Config.User)
	if err != nil {
		return nil, err
	}
	if sc.RunAsUser != nil {
		uid = uint32(*sc.RunAsUser)
	}
	if sc.RunAsGroup != nil {
		gid = uint32(*sc.RunAsGroup)
	}
	if sc.RunAsNonRoot != nil && *sc.RunAsNonRoot && uid == 0 {
		return nil, fmt.Errorf("runAsNonRoot with uid 0: the kubelet refuses to start it")
	}
	args := slices.Concat(r.image.Config.Entrypoint, r.args)
	if r.process != nil {
		args = r.process
	}
	caps := sc.Capabilities.DeepCopy()
	if r.withCaps != nil {
		r.withCaps(caps)
	}
	set := criCapabilities(caps)

	s := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs", Readonly: sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem && !r.writable},
		Process: &specs.Process{
			User: specs.User{UID: uid, GID: gid, AdditionalGids: []uint32{gid}},
			Args: args,
			Env:  slices.Concat(r.image.Config.Env, r.env),
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: set, Effective: set, Permitted: set,
			},
			// The kubelet's allowPrivilegeEscalation defaults to true.
			NoNewPrivileges: sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
			// No Rlimits: containerd's RLIMIT_NOFILE needs CAP_SYS_RESOURCE,
			// which this kind of sandbox's root lacks (doc.go).
		},
		Mounts: slices.Concat(containerdMounts(), r.mounts),
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.MountNamespace},
				// hostNetwork: the pod's network namespace is the node's
				// (here the throwaway one), and so is its UTS namespace.
				{Type: specs.NetworkNamespace, Path: r.netns},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
				"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
				"/sys/firmware", "/sys/devices/virtual/powercap", "/proc/scsi",
			},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
			Resources:     resources(c.Resources),
		},
	}
	switch p := sc.SeccompProfile; {
	case r.noSecc:
	case p == nil || p.Type == corev1.SeccompProfileTypeUnconfined:
		// The kubelet's default without SeccompDefault: unconfined.
	case p.Type == corev1.SeccompProfileTypeRuntimeDefault:
		// containerd's default profile, as its CRI plugin builds it: it
		// allows some syscalls only with the capability they need.
		s.Linux.Seccomp = seccomp.DefaultProfile(s)
	default:
		return nil, fmt.Errorf("seccompProfile %s is not modelled", p.Type)
	}
	return s, nil
}

// criCapabilities is the capability set containerd's CRI plugin derives
// from a securityContext's capabilities: its defaults, then ALL added or
// dropped, then each capability added, then each dropped. Inheritable and
// ambient stay empty.
func criCapabilities(c *corev1.Capabilities) []string {
	set := slices.Clone(containerdDefaultCaps)
	if c == nil {
		return set
	}
	name := func(cp corev1.Capability) string { return "CAP_" + strings.ToUpper(string(cp)) }
	if slices.Contains(c.Add, "ALL") {
		set = allCaps()
	}
	if slices.Contains(c.Drop, "ALL") {
		set = nil
	}
	for _, a := range c.Add {
		if a != "ALL" && !slices.Contains(set, name(a)) {
			set = append(set, name(a))
		}
	}
	for _, d := range c.Drop {
		set = slices.DeleteFunc(set, func(s string) bool { return s == name(d) })
	}
	return set
}

// allCaps are the capabilities the kernel knows (CAP_LAST_CAP of 6.x).
func allCaps() []string {
	var all []string
	for n := range capNames {
		all = append(all, n)
	}
	slices.Sort(all)
	return all
}

// capNames maps the capability names to their numbers.
var capNames = map[string]int{
	"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3, "CAP_FSETID": 4,
	"CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_LINUX_IMMUTABLE": 9,
	"CAP_NET_BIND_SERVICE": 10, "CAP_NET_BROADCAST": 11, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13,
	"CAP_IPC_LOCK": 14, "CAP_IPC_OWNER": 15, "CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17,
	"CAP_SYS_CHROOT": 18, "CAP_SYS_PTRACE": 19, "CAP_SYS_PACCT": 20, "CAP_SYS_ADMIN": 21,
	"CAP_SYS_BOOT": 22, "CAP_SYS_NICE": 23, "CAP_SYS_RESOURCE": 24, "CAP_SYS_TIME": 25,
	"CAP_SYS_TTY_CONFIG": 26, "CAP_MKNOD": 27, "CAP_LEASE": 28, "CAP_AUDIT_WRITE": 29,
	"CAP_AUDIT_CONTROL": 30, "CAP_SETFCAP": 31, "CAP_MAC_OVERRIDE": 32, "CAP_MAC_ADMIN": 33,
	"CAP_SYSLOG": 34, "CAP_WAKE_ALARM": 35, "CAP_BLOCK_SUSPEND": 36, "CAP_AUDIT_READ": 37,
	"CAP_PERFMON": 38, "CAP_BPF": 39, "CAP_CHECKPOINT_RESTORE": 40,
}

// capMask is the /proc/PID/status bit mask of a capability set.
func capMask(set []string) (uint64, error) {
	var m uint64
	for _, c := range set {
		n, ok := capNames[c]
		if !ok {
			return 0, fmt.Errorf("unknown capability %s", c)
		}
		m |= 1 << n
	}
	return m, nil
}

// imageUser parses an image config's User ("", "0", "0:0"); names would
// need the image's /etc/passwd, which an empty base does not have.
func imageUser(u string) (uid, gid uint32, err error) {
	if u == "" {
		return 0, 0, nil
	}
	us, gs, _ := strings.Cut(u, ":")
	n, err := strconv.ParseUint(us, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("image user %q: only numeric users are modelled", u)
	}
	uid = uint32(n)
	if gs != "" {
		g, err := strconv.ParseUint(gs, 10, 32)
		if err != nil {
			return 0, 0, fmt.Errorf("image user %q: only numeric groups are modelled", u)
		}
		gid = uint32(g)
	}
	return uid, gid, nil
}

// containerdMounts are containerd's default mounts for a container that is
// not privileged, and the cgroup mount its CRI plugin adds.
func containerdMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
}

// resources are the container's limits as the CRI plugin writes them: a
// memory limit, a CFS quota for the CPU limit, shares for the CPU request,
// and no devices beyond runc's defaults.
func resources(r corev1.ResourceRequirements) *specs.LinuxResources {
	res := &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}}
	if m, ok := r.Limits[corev1.ResourceMemory]; ok {
		limit := m.Value()
		res.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	cpu := &specs.LinuxCPU{}
	if q, ok := r.Limits[corev1.ResourceCPU]; ok {
		period := uint64(100000)
		quota := q.MilliValue() * int64(period) / 1000
		cpu.Period, cpu.Quota = &period, &quota
	}
	if q, ok := r.Requests[corev1.ResourceCPU]; ok {
		shares := max(uint64(q.MilliValue())*1024/1000, 2)
		cpu.Shares = &shares
	}
	res.CPU = cpu
	return res
}

func TestCRICapabilities(t *testing.T) {
	without := func(set []string, c string) []string {
		return slices.DeleteFunc(slices.Clone(set), func(s string) bool { return s == c })
	}
	for _, tc := range []struct {
		name string
		caps *corev1.Capabilities
		want []string
	}{
		{"none given", nil, containerdDefaultCaps},
		{"the DaemonSet's", &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}}, []string{"CAP_NET_ADMIN"}},
		{"drop ALL only", &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, nil},
		{"drop one", &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}}, without(containerdDefaultCaps, "CAP_NET_RAW")},
		{"add ALL, drop one", &corev1.Capabilities{Add: []corev1.Capability{"ALL"}, Drop: []corev1.Capability{"CHOWN"}}, without(allCaps(), "CAP_CHOWN")},
		{"add one already there", &corev1.Capabilities{Add: []corev1.Capability{"KILL"}}, containerdDefaultCaps},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, criCapabilities(tc.caps)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
