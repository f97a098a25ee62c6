#!/bin/sh
# test/kernels/guest.sh: the guest's second stage, after switch_root into
# the overlay of the host's root (see init.sh). It runs every line of
# $WORK/plan (NAME DIR COMMAND...: test2json running a test binary built on
# the host, in its package's directory) into $WORK/out/NAME.json, then
# powers off. The kernel's modprobe helper is kmod from the cache (the host
# may have none), so modules autoload as on a node.
set -u
arg() { sed -n "s/.*marksplit\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
WORK=$(arg work)
REPO=$(arg repo)
TOOLS=$(arg tools)
# Go too (the examples' signal tests build their program): the host's.
export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
export MARKSPLIT_KERNEL_TESTS=1 GOTRACEBACK=all
off() { sync; echo o >/proc/sysrq-trigger; sleep 60; }
trap off EXIT
mount -t tmpfs tmpfs /run
# A fresh /tmp for the tests. A repository under the host's /tmp (a CI's
# clone there) is bound back in, where the plan's directories name it.
case "$REPO" in
/tmp/*)
	mkdir -p /run/host-tmp && mount --bind /tmp /run/host-tmp
	mount -t tmpfs -o size=512m tmpfs /tmp
	mkdir -p "$REPO" && mount --bind "/run/host-tmp/${REPO#/tmp/}" "$REPO"
	;;
*) mount -t tmpfs -o size=512m tmpfs /tmp ;;
esac
mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
# modprobe for the kernel's autoload: kmod from the cache, with its library.
cat >/run/modprobe <<EOS
#!/bin/sh
LD_LIBRARY_PATH=$TOOLS/lib exec $TOOLS/bin/modprobe "\$@"
EOS
chmod +x /run/modprobe
echo /run/modprobe >/proc/sys/kernel/modprobe
ln -sf /run/modprobe /usr/sbin/modprobe
# The static node kmod gives a real system at boot (kmod static-nodes):
# opening it autoloads tun.
mkdir -p /dev/net && [ -e /dev/net/tun ] || mknod /dev/net/tun c 10 200
ip link set lo up
mkdir -p "$WORK/out"
{
	echo "uname=$(uname -r)"
	echo "nproc=$(nproc)"
	echo "mem=$(sed -n 's/MemTotal: *//p' /proc/meminfo)"
	echo "cgroup2=$(cat /sys/fs/cgroup/cgroup.controllers)"
	echo "clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
} >"$WORK/out/guest"
echo "guest: $(uname -r) up in $(cut -d' ' -f1 /proc/uptime) s"
while read -r name dir cmd; do
	case "$name" in '' | '#'*) continue ;; esac
	echo "guest: $name: start at $(cut -d' ' -f1 /proc/uptime) s"
	# shellcheck disable=SC2086 # the command is split on purpose
	(cd "$dir" && exec $cmd) >"$WORK/out/$name.json" 2>"$WORK/out/$name.stderr"
	echo "guest: $name: exit $? at $(cut -d' ' -f1 /proc/uptime) s"
done <"$WORK/plan"
{
	[ -r /sys/module/wireguard/version ] && echo "wireguard_module=$(cat /sys/module/wireguard/version)"
	awk '{print "module=" $1}' /proc/modules
	echo "done=$(cut -d' ' -f1 /proc/uptime)"
} >>"$WORK/out/guest"
