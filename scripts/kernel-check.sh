#!/bin/sh
# scripts/kernel-check.sh: can this machine run the real-kernel tests?
# Exit 0 when it can (root, iproute2, network namespaces); otherwise print
# one line saying what is missing and exit 1. make test runs it first, so a
# machine without them gets that line instead of a wall of skips or failures.
set -u
if [ "$(id -u)" -ne 0 ]; then
	echo "not root: the real-kernel, Kubernetes and image tests need network namespaces (sudo make test)"
	exit 1
fi
if ! command -v ip >/dev/null 2>&1; then
	echo "ip not found: the real-kernel tests need iproute2 (apt-get install iproute2)"
	exit 1
fi
ns="marksplit-check-$$"
if ! err=$(ip netns add "$ns" 2>&1); then
	echo "network namespaces not permitted here (ip netns add: $err)"
	exit 1
fi
ip netns del "$ns"
