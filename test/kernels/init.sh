#!/bin/busybox sh
# test/kernels/init.sh: /init of the initramfs `make test-kernels` boots.
# It loads the few modules the root needs (listed in /modules.list, in order),
# builds the root: the host's / read-only over 9p (tag host) under an
# overlay with a tmpfs on top, the kernel's own modules (tag modules) on
# /usr/lib/modules, the run's work directory (tag work, writable) at its
# host path, then switch_root (not chroot: the kernel runs modprobe in
# init's root, so after a chroot every module autoload fails) into
# test/kernels/guest.sh, which runs the tests.
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /rw /lower /newroot
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.list); do
	insmod "/lib/$m" || echo "init: insmod $m failed"
done
arg() { sed -n "s/.*marksplit\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
work=$(arg work)
repo=$(arg repo)
opts=trans=virtio,version=9p2000.L,msize=512000,cache=loose
mount -t 9p -o "$opts,ro" host /lower || { echo "init: mount host: failed"; echo o >/proc/sysrq-trigger; }
mount -t tmpfs -o size=1g tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot ||
	{ echo "init: overlay failed"; echo o >/proc/sysrq-trigger; }
mkdir -p /newroot/usr/lib/modules "/newroot$work"
mount -t 9p -o "$opts,ro" modules /newroot/usr/lib/modules
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 work "/newroot$work"
for d in proc sys dev; do mount --move "/$d" "/newroot/$d"; done
exec switch_root /newroot /bin/sh "$repo/test/kernels/guest.sh"
