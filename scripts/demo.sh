#!/usr/bin/env bash
# scripts/demo.sh: what `make demo` runs. As root, with Go and iproute2.
#
# It builds the agent, reproduces a Cilium WireGuard worker in throwaway
# network namespaces (enp7s0 at MTU 1450 to a gateway at 10.0.0.1, a tun
# cilium_wg0 at MTU 1355, the private route lowered to 1355 by the old
# shell loop), shows `ip route get` before, runs `marksplit run
# --encryption=on`, shows the split, deletes the rule to show the repair,
# changes the tunnel MTU to show it followed, and removes everything it
# created: the namespaces (with their links, routes and rules) and the
# binary. The removal also runs on Ctrl-C and on failure.
set -euo pipefail

cd "$(dirname "$0")/.."

die() { echo "demo: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root: the demo creates network namespaces (sudo make demo)"
for c in ip go; do command -v "$c" >/dev/null || die "$c not found in PATH"; done

NS="marksplit-demo-$$"
GW="marksplit-demo-gw-$$"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/marksplit-demo.XXXXXX")"
AGENT_PID=""

cleanup() {
	local code=$?
	trap - EXIT INT TERM
	if [ -n "$AGENT_PID" ] && kill -0 "$AGENT_PID" 2>/dev/null; then
		kill -TERM "$AGENT_PID" 2>/dev/null || true
		wait "$AGENT_PID" 2>/dev/null || true
	fi
	# Deleting a namespace deletes its links, and with them their
	# addresses, routes and the veth peer; its rules go with it.
	ip netns del "$NS" 2>/dev/null || true
	ip netns del "$GW" 2>/dev/null || true
	rm -rf "$WORK"
	if [ "$code" -ne 0 ]; then
		echo
		echo "demo: stopped (exit $code); the namespaces and files it created are removed" >&2
	fi
	exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bold=""; off=""
if [ -t 1 ]; then bold=$'\033[1m'; off=$'\033[0m'; fi
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$off"; }
# show prints a command as run on the node, then runs it there.
show() { printf '  node# %s\n' "$*"; ip netns exec "$NS" "$@" | sed 's/^/    /'; }
# until_ok polls a condition for at most $1 seconds.
until_ok() {
	local deadline=$((SECONDS + $1)); shift
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || die "timed out waiting for: $*"
		sleep 0.01
	done
}
node() { ip netns exec "$NS" "$@"; }
# agent_says prints the agent's log messages from line $1 on.
agent_says() { tail -n +"$1" "$WORK/agent.log" | sed -n 's/.*level=\([A-Z]*\) msg="\(.*\)"$/    agent: \2/p'; }
log_lines() { wc -l <"$WORK/agent.log"; }

step "Build the agent"
go build -o "$WORK/marksplit" ./agent
echo "    $WORK/marksplit"

step "A worker node in namespace $NS, its gateway in $GW"
ip netns add "$NS"
ip netns add "$GW"
ip -n "$NS" link set lo up
ip -n "$GW" link set lo up
ip -n "$NS" link add enp7s0 mtu 1450 type veth peer name gw0 mtu 1450 netns "$GW"
ip -n "$GW" addr add 10.0.0.1/16 dev gw0
ip -n "$GW" link set gw0 up
# The node's address comes from DHCP, with the gateway on link and the
# private network through it, as on cloud private networks; the old shell
# loop has lowered that route to the tunnel MTU.
ip -n "$NS" addr add 10.0.0.5/16 dev enp7s0 noprefixroute
ip -n "$NS" link set enp7s0 up
ip -n "$NS" route add 10.0.0.1 dev enp7s0 proto dhcp scope link src 10.0.0.5
ip -n "$NS" route add 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.5 mtu 1355
# Cilium's WireGuard link (a tun stands in for it): device MTU - 95.
ip -n "$NS" tuntap add mode tun name cilium_wg0
ip -n "$NS" link set cilium_wg0 mtu 1355 up
show ip -br link
show ip route

step "Before: host traffic and WireGuard's own (marked) packets share one MTU"
show ip route get 10.0.0.9
show ip route get 10.0.0.9 mark 0xe00
echo "    (1355 fits host traffic into the tunnel, but WireGuard's UDP, 60 bytes larger"
echo "     and sent without DF, needs 1450: at 1355 its outer packets fragment)"

step "Run the agent: marksplit run --prefix=10.0.0.0/16 --encryption=on"
# Started directly, not through a shell function, so that $! is the agent
# itself (ip netns exec execs it) and SIGTERM reaches it.
ip netns exec "$NS" "$WORK/marksplit" run --prefix=10.0.0.0/16 --encryption=on --metrics-addr= >"$WORK/agent.log" 2>&1 &
AGENT_PID=$!
split() { node ip rule show pref 900 | grep -q . && node ip route get 10.0.0.9 | grep -q 'table 900'; }
until_ok 10 split
until_ok 2 grep -q 'dhcp route' "$WORK/agent.log"
agent_says 1

step "After: unmarked packets use table 900 at the tunnel MTU; marked ones keep 1450"
show ip rule
show ip route show table 900
show ip route get 10.0.0.9
show ip route get 10.0.0.9 mark 0xe00

step "Someone deletes the rule"
from=$(($(log_lines) + 1))
show ip rule del pref 900
until_ok 5 node sh -c 'ip rule show pref 900 | grep -q .'
show ip rule show pref 900
agent_says "$from"

step "A Cilium upgrade changes the tunnel MTU: 1355 -> 1420"
from=$(($(log_lines) + 1))
show ip link set cilium_wg0 mtu 1420
until_ok 5 node sh -c 'ip route get 10.0.0.9 | grep -q "mtu 1420"'
agent_says "$from"
show ip route get 10.0.0.9
show ip route get 10.0.0.9 mark 0xe00

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
show ip route show table all proto 109

step "Remove the namespaces and the binary"
cleanup
