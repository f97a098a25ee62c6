//go:build linux

package netwatch

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"golang.org/x/sys/unix"
)

// NetNS is an open network namespace: a file descriptor of
// /run/netns/NAME or /proc/PID/ns/net, which keeps the namespace alive for
// as long as it is open. A Watcher or Applier given it in Options.NetNS
// uses it whenever it opens a socket (a Watcher reconnects, and resyncs on
// a new socket after an overflow): close it only after they are done.
// netwatchtest's fake kernel hands out a NetNS too (Kernel.NetNS), which
// puts a Watcher or an Applier on the fake.
type NetNS rtnl.NetNS

// Close closes the namespace's file descriptor. It is safe to call twice.
func (ns *NetNS) Close() error { return (*rtnl.NetNS)(ns).Close() }

// nsGetNSType is NS_GET_NSTYPE (linux/nsfs.h), which x/sys/unix lacks.
const nsGetNSType = 0xb703

// OpenNetNS opens the network namespace at path. It fails, at once, on a
// path that is not a network namespace (another kind of namespace, a
// regular file, a directory, a FIFO or a device), rather than leaving a
// program to hang or to watch the wrong namespace: path is first opened
// with O_PATH, which opens nothing, and only a file of nsfs is then opened
// for reading. Entering another namespace needs CAP_SYS_ADMIN; the
// process's own (/proc/self/ns/net, or a /run/netns name for it) needs no
// privilege: its sockets are opened where they would be without NetNS.
func OpenNetNS(path string) (*NetNS, error) {
	pfd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("netwatch: open network namespace %s: %w", path, err)
	}
	defer unix.Close(pfd)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(pfd, &fs); err != nil {
		return nil, fmt.Errorf("netwatch: network namespace %s: %w", path, err)
	}
	if fs.Type != unix.NSFS_MAGIC {
		return nil, fmt.Errorf("netwatch: %s is not a namespace (%s)", path, fileKind(pfd))
	}
	// Reopen the very file the O_PATH descriptor holds: an ioctl and
	// setns need a descriptor opened for reading.
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("netwatch: open network namespace %s: %w", path, err)
	}
	typ, err := unix.IoctlRetInt(fd, nsGetNSType)
	switch {
	case errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EINVAL):
		unix.Close(fd)
		return nil, fmt.Errorf("netwatch: %s is not a namespace", path)
	case err != nil:
		unix.Close(fd)
		return nil, fmt.Errorf("netwatch: network namespace %s: %w", path, err)
	case typ != unix.CLONE_NEWNET:
		unix.Close(fd)
		return nil, fmt.Errorf("netwatch: %s is a namespace, but not a network namespace", path)
	}
	return (*NetNS)(rtnl.OpenedNetNS(fd, sameFile(fd, "/proc/self/ns/net"))), nil
}

// fileKind names the kind of file fd is, for an error.
func fileKind(fd int) string {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return "not a file of nsfs"
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	}
	return "not a file of nsfs"
}

// sameFile reports whether fd is the file at path (namespaces are files
// of nsfs: one device, an inode each).
func sameFile(fd int, path string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) != nil || unix.Stat(path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}
