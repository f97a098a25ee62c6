#!/usr/bin/env bash
# scripts/demo.sh: what `make demo` runs. As root, with Go and iproute2.
#
# It reproduces a Cilium WireGuard worker and a peer node on a real
# WireGuard tunnel in throwaway network namespaces: the worker's enp7s0 at
# MTU 1450 to a gateway at 10.0.0.1 (a bridge the peer is on too), each
# node's cilium_wg0 at the tunnel MTU 1355 with Cilium's mark (wg fwmark
# 0xe00), and the worker's private route lowered to 1355 by the old shell
# loop. It sends full-size traffic through the tunnel and shows FragOKs
# climbing, a bulk TCP transfer starving; runs `marksplit run`; sends the
# same traffic again (FragOKs flat, nothing lost, the transfer at full
# speed); shows host traffic to the peer still at the tunnel MTU (ip route
# get, and a host TCP connection that tc mirred redirects into the tunnel,
# as Cilium's BPF does, where tc has u32 and mirred); deletes the rule to
# show the repair; then puts a third node behind a silent black hole (a
# veth that carries 1304 bytes and sends no ICMP) and runs the agent with
# --peers=auto against the tests' stand-in API server (wgtunnel api): host
# TCP to that node stalls at the tunnel MTU, and with --path-mtu-probe its
# route gets the measured 1232 and the transfer completes; and removes
# everything it created: the
# namespaces, the WireGuard processes (with their private mounts) and its
# files. The removal also runs on Ctrl-C and on failure.
#
# WireGuard is the kernel's where `ip link add type wireguard` works, else
# wireguard-go (userspace, on /dev/net/tun), built once from its pinned Go
# module (test/wireguard/wireguard-go) into ${MARKSPLIT_CACHE:-/var/cache/marksplit}.
# Each wireguard-go runs in a private mount namespace with its own tmpfs on
# /run: its control socket /run/wireguard/cilium_wg0.sock is one path for the
# whole host, and both nodes name their device cilium_wg0. `wg` (Debian's
# wireguard-tools, installed without recommends when missing) reaches it with
# `nsenter -m -n -t PID`.
set -euo pipefail

cd "$(dirname "$0")/.."

die() { echo "demo: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root: the demo creates network namespaces (sudo make demo)"
for c in ip go unshare nsenter; do command -v "$c" >/dev/null || die "$c not found in PATH"; done

W="marksplit-demo-$$"      # the worker node
P="marksplit-demo-peer-$$" # the peer node
G="marksplit-demo-gw-$$"   # the gateway both reach their private network through
H="marksplit-demo-hole-$$" # a peer node behind a silent black hole (the path-MTU scene)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/marksplit-demo.XXXXXX")"
AGENT_PID=""
WG_PIDS=()  # wireguard-go processes, one per node
AUX_PIDS=() # the path-MTU scene's stand-in API server and probe responders

# stop_pid sends SIGTERM to one process the demo started and waits for it,
# with SIGKILL after 3 s.
stop_pid() {
	local pid=$1 i
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.01; done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

cleanup() {
	local code=$? pid
	trap - EXIT INT TERM
	[ -z "$AGENT_PID" ] || stop_pid "$AGENT_PID"
	# wireguard-go removes its device when it exits; its tmpfs goes with
	# its private mount namespace.
	for pid in "${WG_PIDS[@]}"; do stop_pid "$pid"; done
	for pid in "${AUX_PIDS[@]}"; do stop_pid "$pid"; done
	# Deleting a namespace deletes its links, and with them their
	# addresses, routes and the veth peer; its rules go with it.
	ip netns del "$W" 2>/dev/null || true
	ip netns del "$P" 2>/dev/null || true
	ip netns del "$G" 2>/dev/null || true
	ip netns del "$H" 2>/dev/null || true
	rm -rf "$WORK"
	if [ "$code" -ne 0 ]; then
		echo
		echo "demo: stopped (exit $code); the namespaces, processes and files it created are removed" >&2
	fi
	exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bold=""; off=""
if [ -t 1 ]; then bold=$'\033[1m'; off=$'\033[0m'; fi
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$off"; }
# show prints a command as run on the worker, then runs it there.
show() { printf '  worker# %s\n' "$*"; ip netns exec "$W" "$@" | sed 's/^/    /'; }
# until_ok polls a condition for at most $1 seconds.
until_ok() {
	local deadline=$((SECONDS + $1)); shift
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || die "timed out waiting for: $*"
		sleep 0.01
	done
}
node() { ip netns exec "$W" "$@"; }
# agent_says prints the agent's log messages from line $1 on.
agent_says() { tail -n +"$1" "$WORK/agent.log" | sed -n 's/.*level=\([A-Z]*\) msg="\(.*\)"$/    agent: \2/p'; }
log_lines() { wc -l <"$WORK/agent.log"; }
# traffic runs wgtunnel (test/wireguard/cmd/wgtunnel) from the worker's
# tunnel address to the peer's.
fullsize() { printf '    '; "$WORK/wgtunnel" fullsize -from "$W" -to "$P" -dst 10.244.9.1:9000 -count 200; }
bulk() { printf '    '; "$WORK/wgtunnel" bulk -from "$W" -to "$P" -dst "${1:-10.244.9.1:9001}" -mb 20 -limit "${2:-3s}"; }

step "Build the agent and the traffic tool; WireGuard's tools"
go build -o "$WORK/marksplit" ./agent
(cd test/wireguard && go build -o "$WORK/wgtunnel" ./cmd/wgtunnel)
scripts/install-wireguard-tools.sh | sed 's/^/    /'
KERNEL_WG=0
ip netns add "$G"
if ip -n "$G" link add wgprobe type wireguard 2>/dev/null; then
	KERNEL_WG=1
	ip -n "$G" link del wgprobe
	WG_USED="the kernel's (module wireguard $(cat /sys/module/wireguard/version 2>/dev/null || echo built in), Linux $(uname -r))"
else
	WGGO=$(cd test/wireguard && "$WORK/wgtunnel" wireguard-go wireguard-go)
	WG_USED="wireguard-go, userspace: this kernel ($(uname -r)) has no WireGuard ($WGGO)"
fi
echo "    WireGuard: $WG_USED"

step "A worker ($W) and a peer node ($P) behind a gateway ($G)"
ip -n "$G" link set lo up
ip -n "$G" link add br0 mtu 1450 type bridge
ip -n "$G" addr add 10.0.0.1/16 dev br0
ip -n "$G" link set br0 up
ip netns exec "$G" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.send_redirects=0 net.ipv4.conf.br0.send_redirects=0
umask 077
# nodeup NS ADDR SUFFIX: a node whose private address comes from DHCP, with
# the gateway on link and the private network through it, as on cloud
# private networks.
nodeup() {
	ip netns add "$1"
	ip -n "$1" link set lo up
	ip -n "$1" link add enp7s0 mtu 1450 type veth peer name "gw-$3" mtu 1450 netns "$G"
	ip -n "$G" link set "gw-$3" master br0 up
	ip -n "$1" addr add "$2/16" dev enp7s0 noprefixroute
	ip -n "$1" link set enp7s0 up
	ip -n "$1" route add 10.0.0.1 dev enp7s0 proto dhcp scope link src "$2"
	wg genkey >"$WORK/$3.key"
	wg pubkey <"$WORK/$3.key" >"$WORK/$3.pub"
}
nodeup "$W" 10.0.0.5 w
nodeup "$P" 10.0.0.9 p
# The old shell loop has lowered the worker's route to the tunnel MTU.
ip -n "$W" route add 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.5 mtu 1355
ip -n "$P" route add 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.9

# wgup NS SUFFIX TUNNEL-ADDR PEER-SUFFIX PEER-ENDPOINT PEER-ALLOWED: the
# node's cilium_wg0 as Cilium configures it: MTU 1450 - 95, fwmark 0xe00.
wgup() {
	local ns=$1 me=$2 addr=$3 peer=$4 endpoint=$5 allowed=$6 pid
	local wgset=(wg set cilium_wg0 listen-port 51871 fwmark 0xe00 private-key "$WORK/$me.key"
		peer "$(cat "$WORK/$peer.pub")" endpoint "$endpoint" allowed-ips "$allowed")
	if [ "$KERNEL_WG" = 1 ]; then
		ip -n "$ns" link add cilium_wg0 type wireguard
		ip netns exec "$ns" "${wgset[@]}"
	else
		# ip netns exec, then unshare (private mounts), then sh, then
		# wireguard-go: each execs the next, so $! is wireguard-go.
		ip netns exec "$ns" unshare -m --propagation private \
			sh -c 'mount -t tmpfs wireguard /run && exec "$0" -f cilium_wg0' "$WGGO" >"$WORK/wg-$me.log" 2>&1 &
		pid=$!
		WG_PIDS+=("$pid")
		until_ok 10 nsenter -m -t "$pid" test -S /run/wireguard/cilium_wg0.sock
		nsenter -m -n -t "$pid" "${wgset[@]}"
	fi
	ip -n "$ns" addr add "$addr" dev cilium_wg0
	ip -n "$ns" link set cilium_wg0 mtu 1355 up
}
# As with Cilium's node encryption, each peer's allowed IPs hold its node
# address too: host traffic redirected into the tunnel is accepted (and
# answered on enp7s0).
for ns in "$W" "$P"; do
	ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
done
wgup "$W" w 10.244.5.1/16 p 10.0.0.9:51871 10.244.9.0/24,10.0.0.9/32
wgup "$P" p 10.244.9.1/16 w 10.0.0.5:51871 10.244.5.0/24,10.0.0.5/32
# Cilium's BPF on enp7s0's egress sends host packets for a peer node into
# cilium_wg0; tc mirred does it here for host TCP. (Cilium tells
# WireGuard's own packets by their mark; u32's mark match is not on every
# kernel, and WireGuard's packets, UDP, never match.)
REDIRECT=0
if tc -n "$W" qdisc add dev enp7s0 clsact 2>/dev/null &&
	tc -n "$W" filter add dev enp7s0 egress prio 1 protocol ip u32 \
		match ip dst 10.0.0.9/32 match ip protocol 6 0xff action mirred egress redirect dev cilium_wg0 2>/dev/null; then
	REDIRECT=1
fi
show ip -br link
show ip route
echo "    (cilium_wg0: WireGuard to the peer at 10.0.0.9:51871, its packets marked 0xe00; pod network 10.244.0.0/16 through it)"
if [ "$REDIRECT" = 1 ]; then
	echo "    (and host TCP to the peer's node address 10.0.0.9, as Cilium redirects it: tc mirred on enp7s0)"
fi

step "Without the agent: WireGuard's packets (1355 + 60 = 1415 bytes) take the 1355 route"
show ip route get 10.0.0.9 mark 0xe00
echo "  200 full-size packets through the tunnel (worker 10.244.5.1 -> peer 10.244.9.1):"
fullsize
echo "  a bulk TCP transfer through the tunnel (at most 3 s):"
bulk
if [ "$KERNEL_WG" = 1 ]; then
	echo "    (every full-size packet left in two fragments: the kernel's WireGuard sends without DF, and"
	echo "     the kernel fragments what is larger than the route's MTU)"
else
	echo "    (every full-size packet left in two fragments; the bulk transfer starves: wireguard-go"
	echo "     sends its batches with UDP GSO, and the kernel refuses batches larger than the route's MTU)"
fi

step "Run the agent: marksplit run --prefix=10.0.0.0/16 --encryption=on"
# Started directly, not through a shell function, so that $! is the agent
# itself (ip netns exec execs it) and SIGTERM reaches it.
ip netns exec "$W" "$WORK/marksplit" run --prefix=10.0.0.0/16 --encryption=on --metrics-addr= >"$WORK/agent.log" 2>&1 &
AGENT_PID=$!
split() { node ip rule show pref 900 | grep -q . && node ip route get 10.0.0.9 | grep -q 'table 900'; }
until_ok 10 split
until_ok 2 grep -q 'dhcp route' "$WORK/agent.log"
agent_says 1

step "With the agent: the same traffic"
fullsize
bulk 10.244.9.1:9001 10s
echo "    (nothing fragmented, nothing lost: WireGuard's marked packets use the main route at 1450)"

step "Host traffic to the peer is still built at the tunnel MTU; only WireGuard's own gets 1450"
show ip rule show pref 900
show ip route get 10.0.0.9
show ip route get 10.0.0.9 mark 0xe00
echo "    (unmarked: table 900 at 1355, so host sockets build packets that fit the tunnel;"
echo "     marked 0xe00: the main route, with no MTU of its own: enp7s0's 1450)"
if [ "$REDIRECT" = 1 ]; then
	echo "  a host TCP connection to the peer's node address 10.0.0.9, redirected into the tunnel:"
	bulk 10.0.0.9:9002 10s
	echo "    (segments for 1355 - 52 bytes of headers and options: they fill the tunnel and leave it whole)"
fi

step "Someone deletes the rule"
from=$(($(log_lines) + 1))
show ip rule del pref 900
until_ok 5 node sh -c 'ip rule show pref 900 | grep -q .'
agent_says "$from"
fullsize

step "Stop the agent (SIGTERM): it exits 0 and leaves the split in place"
kill -TERM "$AGENT_PID"
code=0
wait "$AGENT_PID" || code=$?
AGENT_PID=""
echo "    exit code $code"
show ip route get 10.0.0.9

step "marksplit cleanup removes what the agent owns, and only that"
node "$WORK/marksplit" cleanup --prefix=10.0.0.0/16 | sed 's/^/    /'
show ip rule

step "A third node ($H) behind a silent black hole"
# Its link from the gateway's bridge ends in a veth of MTU 1300: frames up to
# 1304 bytes pass, larger ones vanish, and nothing sends ICMP, as on some
# paths between clouds (cilium#47176).
nodeup "$H" 10.0.0.13 h
ip -n "$H" link set enp7s0 mtu 1300
ip -n "$H" route add 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.13
ip netns exec "$H" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
wgup "$H" h 10.244.13.1/16 w 10.0.0.5:51871 10.244.5.0/24,10.0.0.5/32
wg_worker() {
	if [ "$KERNEL_WG" = 1 ]; then ip netns exec "$W" wg "$@"; else nsenter -m -n -t "${WG_PIDS[0]}" wg "$@"; fi
}
wg_worker set cilium_wg0 peer "$(cat "$WORK/h.pub")" endpoint 10.0.0.13:51871 allowed-ips 10.244.13.0/24,10.0.0.13/32
# The DHCP client's route again, at the link's MTU: the old loop is gone.
ip -n "$W" route replace 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.5
# A GSO packet crosses a veth whatever its size: the worker sends single
# segments, as a NIC without TSO does (wireguard-go batches with UDP GSO).
ip -n "$W" link set dev enp7s0 gso_max_segs 1
if [ "$REDIRECT" = 1 ] && tc -n "$W" filter add dev enp7s0 egress prio 1 protocol ip u32 \
	match ip dst 10.0.0.13/32 match ip protocol 6 0xff action mirred egress redirect dev cilium_wg0 2>/dev/null; then
	# --peers=auto reads the CiliumNodes: the tests' stand-in API server
	# lists the three nodes; each peer answers probes, as its agent would.
	mkdir "$WORK/api"
	"$WORK/wgtunnel" api -ns "$W" -dir "$WORK/api" node-self=10.0.0.5 peer=10.0.0.9 hole=10.0.0.13 >"$WORK/api.log" 2>&1 &
	AUX_PIDS+=("$!")
	until_ok 10 grep -q ready "$WORK/api.log"
	for ns in "$P" "$H"; do
		"$WORK/wgtunnel" respond -ns "$ns" -allow 10.0.0.5 &
		AUX_PIDS+=("$!")
	done
	# run_peers ARGS: the agent with --peers=auto; $! is the agent.
	run_peers() {
		# shellcheck disable=SC2046 # one KEY=VALUE a line, no spaces
		ip netns exec "$W" env $(cat "$WORK/api/env") "$WORK/marksplit" run --peers=auto --encryption=auto \
			--node-name=node-self --metrics-addr= --health-socket= "$@" >"$WORK/agent.log" 2>&1 &
		AGENT_PID=$!
	}
	stop_agent() { stop_pid "$AGENT_PID"; AGENT_PID=""; }
	bulk_to() { printf '    '; "$WORK/wgtunnel" bulk -from "$W" -to "$1" -dst "$2" -mb 20 -limit "$3"; }
	peer_routes() { [ "$(node ip route show table 900 | grep -c mtu)" -eq 2 ]; }

	step "marksplit run --peers=auto: each peer node gets a route at the tunnel MTU"
	run_peers --path-mtu-probe=false
	until_ok 20 peer_routes
	show ip route show table 900
	echo "  host TCP to 10.0.0.9, the full path, through the tunnel:"
	bulk_to "$P" 10.0.0.9:9002 10s
	echo "  host TCP to 10.0.0.13, behind the black hole (at most 3 s):"
	bulk_to "$H" 10.0.0.13:9003 3s
	echo "    (it stalls: each full segment is 1300 bytes inside the tunnel, 1372 outside, and vanishes;"
	echo "     no ICMP comes back, so neither TCP nor the kernel ever learns that it should be smaller)"
	stop_agent

	step "marksplit run --peers=auto --path-mtu-probe: it measures each peer's path"
	run_peers --path-mtu-probe=true
	until_ok 120 node sh -c 'ip route show table 900 10.0.0.13 | grep -q "mtu 1232"'
	show ip route show table 900
	grep -o 'msg="path MTU of peer[^"]*"' "$WORK/agent.log" | sed 's/^msg="/    agent: /; s/"$//'
	echo "  host TCP to 10.0.0.13 again:"
	bulk_to "$H" 10.0.0.13:9003 10s
	echo "    (probes with WireGuard's mark found 1296 bytes through the hole: the peer's route carries"
	echo "     floor16(1296 - 60) = 1232, WireGuard's packets are 1292 bytes outside, and all of it arrives;"
	echo "     the full-path peer keeps 1355)"
	stop_agent
	ip netns exec "$W" env $(cat "$WORK/api/env") "$WORK/marksplit" cleanup --peers=auto --encryption=auto \
		--node-name=node-self >/dev/null
else
	echo "    (skipped: this kernel cannot redirect host TCP into the tunnel with tc u32 and mirred)"
fi

echo
echo "WireGuard used: $WG_USED"

step "Remove the namespaces, the WireGuard processes and the binaries"
cleanup
