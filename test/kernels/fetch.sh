#!/usr/bin/env bash
# test/kernels/fetch.sh: fetch, once, what `make test-kernels` boots, into
# $MARKSPLIT_CACHE/kernels (default /var/cache/marksplit/kernels):
#   - Debian's generic kernel packages (the -cloud- flavour has no 9p) for
#     5.10 (bullseye), 6.1 (bookworm) and 6.12 (trixie), extracted with
#     their modules, depmod'ed, in KERNEL/ (vmlinuz, modules/VERSION/...);
#   - busybox-static and cpio (extracted, for the initramfs), in tools/;
#   - QEMU (qemu-system-x86, installed on the host without recommends when
#     qemu-system-x86_64 is missing; its packages are kept in apt/).
# Each suite is read through a scratch sources list (apt's own state is left
# alone). Prints the cache directory. As root.
set -euo pipefail
CACHE="${MARKSPLIT_CACHE:-/var/cache/marksplit}/kernels"
KERNELS="${KERNELS:-5.10 6.1 6.12}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$CACHE"
log="$CACHE/fetch.log"

suite_of() {
	case "$1" in
	5.10) echo bullseye ;; 6.1) echo bookworm ;; 6.12) echo trixie ;;
	*) echo "fetch: no Debian suite known for kernel $1" >&2; return 1 ;;
	esac
}

# apt_suite SUITE apt-get|apt-cache ARGS...: apt against SUITE's main only,
# with state in $CACHE/apt/SUITE.
apt_suite() {
	local suite=$1 tool=$2 d="$CACHE/apt/$1"
	shift 2
	mkdir -p "$d/lists/partial" "$d/archives/partial"
	echo "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $suite main" >"$d/sources.list"
	"$tool" -q -o Dir::Etc::sourcelist="$d/sources.list" -o Dir::Etc::sourceparts=- \
		-o Dir::State::Lists="$d/lists" -o Dir::Cache::archives="$d/archives" \
		-o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= \
		-o APT::Get::List-Cleanup=0 -o Debug::NoLocking=1 "$@"
}

# download SUITE PACKAGE DIR: the .deb of PACKAGE from SUITE into DIR.
download() {
	local suite=$1 pkg=$2 dir=$3
	mkdir -p "$dir"
	(cd "$dir" && apt_suite "$suite" apt-get download "$pkg") >>"$log" 2>&1 || {
		tail -20 "$log" >&2
		echo "fetch: apt-get download $pkg ($suite) failed" >&2
		return 1
	}
}

updated=""
update() {
	case " $updated " in *" $1 "*) return 0 ;; esac
	apt_suite "$1" apt-get update >>"$log" 2>&1 || { tail -20 "$log" >&2; echo "fetch: apt-get update ($1) failed" >&2; return 1; }
	updated="$updated $1"
}

# The host's suite, for the tools.
host_suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")

# kmod: depmod here, and the guest kernel's modprobe helper (the host may
# have none: a container image often lacks kmod). Run from the cache with
# LD_LIBRARY_PATH=tools/lib; its name picks the tool (bin/depmod, bin/modprobe).
if [ ! -f "$CACHE/tools/ready" ]; then
	echo "fetch: busybox-static, cpio, kmod ($host_suite)" >&2
	update "$host_suite"
	rm -rf "$CACHE/tools.tmp" && mkdir -p "$CACHE/tools.tmp/debs"
	for p in busybox-static cpio kmod libkmod2; do download "$host_suite" "$p" "$CACHE/tools.tmp/debs"; done
	for deb in "$CACHE"/tools.tmp/debs/*.deb; do dpkg-deb -x "$deb" "$CACHE/tools.tmp/root"; done
	mkdir -p "$CACHE/tools.tmp/bin" "$CACHE/tools.tmp/lib"
	r="$CACHE/tools.tmp/root"
	cp "$r/bin/busybox" "$r/bin/cpio" "$r/bin/kmod" "$CACHE/tools.tmp/bin/"
	cp -a "$r"/usr/lib/x86_64-linux-gnu/libkmod.so* "$r"/lib/x86_64-linux-gnu/libkmod.so* "$CACHE/tools.tmp/lib/" 2>/dev/null || true
	ls "$CACHE"/tools.tmp/lib/libkmod.so.2 >/dev/null
	ln -s kmod "$CACHE/tools.tmp/bin/depmod"
	ln -s kmod "$CACHE/tools.tmp/bin/modprobe"
	rm -rf "$r" "$CACHE/tools.tmp/debs"
	touch "$CACHE/tools.tmp/ready"
	rm -rf "$CACHE/tools" && mv "$CACHE/tools.tmp" "$CACHE/tools"
fi
depmod() { LD_LIBRARY_PATH="$CACHE/tools/lib" "$CACHE/tools/bin/depmod" "$@"; }

if ! command -v qemu-system-x86_64 >/dev/null; then
	echo "fetch: qemu-system-x86 from Debian (without recommends)" >&2
	mkdir -p "$CACHE/apt/host/partial"
	export DEBIAN_FRONTEND=noninteractive
	{ apt-get update -q && apt-get install -y -q --no-install-recommends \
		-o Dir::Cache::archives="$CACHE/apt/host" qemu-system-x86; } >>"$log" 2>&1 ||
		{ tail -20 "$log" >&2; echo "fetch: installing qemu-system-x86 failed" >&2; exit 1; }
fi

for k in $KERNELS; do
	dir="$CACHE/$k"
	[ -f "$dir/ready" ] && continue
	suite=$(suite_of "$k")
	echo "fetch: Debian's $k kernel ($suite)" >&2
	update "$suite"
	# The versioned package linux-image-amd64 depends on, generic flavour.
	pkg=$(apt_suite "$suite" apt-cache depends linux-image-amd64 2>>"$log" |
		sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)\( \|$\).*/\1/p' | grep -v cloud | head -1)
	[ -n "$pkg" ] || { echo "fetch: no generic kernel package in $suite" >&2; exit 1; }
	rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/debs"
	download "$suite" "$pkg" "$dir.tmp/debs"
	dpkg-deb -x "$dir.tmp"/debs/*.deb "$dir.tmp/root"
	root="$dir.tmp/root"
	vmlinuz=$(ls "$root"/boot/vmlinuz-* | head -1)
	version=${vmlinuz##*/vmlinuz-}
	# trixie ships its modules only under usr/lib/modules.
	mods="$root/lib/modules/$version"
	[ -d "$mods" ] || mods="$root/usr/lib/modules/$version"
	[ -d "$mods" ] || { echo "fetch: no modules for $version in $pkg" >&2; exit 1; }
	mkdir -p "$dir.tmp/modules"
	mv "$mods" "$dir.tmp/modules/$version"
	# depmod -b BASE reads BASE/lib/modules.
	mkdir -p "$dir.tmp/lib" && ln -s ../modules "$dir.tmp/lib/modules"
	depmod -b "$dir.tmp" "$version"
	cp "$vmlinuz" "$dir.tmp/vmlinuz"
	echo "$version" >"$dir.tmp/version"
	echo "$pkg" >"$dir.tmp/package"
	rm -rf "$root" "$dir.tmp/debs"
	touch "$dir.tmp/ready"
	rm -rf "$dir" && mv "$dir.tmp" "$dir"
done
echo "$CACHE"
