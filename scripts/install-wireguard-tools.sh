#!/bin/sh
# scripts/install-wireguard-tools.sh: install `wg` (Debian's wireguard-tools)
# when it is missing, for `make demo` and `make test`. Without recommends:
# with them, apt pulls a kernel image. As root.
set -eu
command -v wg >/dev/null 2>&1 && exit 0
echo "installing wireguard-tools from Debian (without recommends: they pull a kernel image)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends wireguard-tools >/dev/null
command -v wg >/dev/null
