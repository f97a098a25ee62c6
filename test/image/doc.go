// Package image runs the agent's container image the way the DaemonSet
// runs it, in a real OCI runtime, and checks that it does its job there.
//
// It holds tests, and the probe program (./probe) they run beside the agent.
// TestKernelImageAsDaemonSet unpacks the linux/amd64 image of the OCI
// layout that `make image` writes (bin/marksplit-image.tar, or
// $MARKSPLIT_IMAGE), writes an OCI runtime config for it from
// ../../deploy/daemonset.yaml — read from the manifest, not restated: the
// container's args and env ($(VAR) expanded as the kubelet does), its
// securityContext turned into what containerd's CRI plugin would ask of runc
// (uid and gid; capability sets for drop ALL + add NET_ADMIN; read-only root;
// no new privileges; containerd's default seccomp profile for RuntimeDefault;
// hostNetwork as joining the network namespace), its resource limits — and
// runs it with runc in a throwaway network namespace that holds the seed
// topology of `make demo`. It shows that the agent converges (`ip route get`
// with and without the mark), that the exec probes (`marksplit health`
// over the health socket, in the pod's emptyDir) answer as runc exec runs
// them, that the container's process has exactly the
// capabilities, privileges, seccomp filter and read-only root asked for,
// and that SIGTERM (`runc kill`, as the kubelet's stop does) exits 0 and
// leaves the split in place.
//
// The negative tests show that the checks can fail: the same image without
// NET_ADMIN does not converge and logs EPERM; the probe's write to / succeeds
// once the root is writable and its get_mempolicy(2) once seccomp is off. The agent's own log must not show a write refused by the read-only
// root or an operation it was not permitted.
//
// # The policy in a cluster-less run
//
// The manifest's policy flags may need a cluster (--encryption=auto reads the
// node's CiliumNode; --peers=auto lists every CiliumNode). The test keeps
// every other arg as the manifest has it, and replaces the policy args
// (--prefix, --peers, --underlay-link, --encryption, --node-name) by
// --prefix=10.0.0.0/16 --encryption=on, the seed topology's network on an
// encrypting node. It logs the args it runs.
//
// # Running
//
//	make test-image    # builds the image, then runs these tests
//
// The tests need root and network namespaces; runc is installed from Debian
// (apt-get install runc) when it is missing. Without them they skip with the
// reason, and fail instead under MARKSPLIT_KERNEL_TESTS=1. The config has no
// process.rlimits (containerd sets RLIMIT_NOFILE): setting one needs
// CAP_SYS_RESOURCE, which some sandboxes' root lacks.
//
// # Debugging
//
// A failing test logs the agent's output and the config.json it ran.
// Namespaces are named msimg-<pid>-<n>…, containers msimg-<pid>-<n>; runc's
// state lives in the test's temporary directory. A killed run's namespaces
// are removed by the next.
package image
