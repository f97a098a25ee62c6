#!/bin/sh
# scripts/install-wireguard-tools.sh: install `wg` (Debian's wireguard-tools)
# when it is missing, for `make demo` and `make test`. Without recommends:
# with them, apt pulls a kernel image. As root.
set -eu
command -v wg >/dev/null 2>&1 && exit 0
echo "installing wireguard-tools from Debian (without recommends: they pull a kernel image)"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends wireguard-tools; } >"$log" 2>&1; then
	cat "$log" >&2
	echo "install-wireguard-tools: apt-get failed" >&2
	exit 1
fi
command -v wg >/dev/null
