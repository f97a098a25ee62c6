//go:build linux

package lock

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/internal/sockdiag"
	"github.com/marksplit/marksplit/internal/textsafe"
)

// lockPrefix begins the name of every lock socket; legacyTablePrefix is
// the lock of versions that locked the table alone
// ("@marksplit/table/900"), still honoured.
const (
	lockPrefix        = "@marksplit/"
	agentLockPrefix   = lockPrefix + "agent/"
	legacyTablePrefix = lockPrefix + "table/"
	lockGreeting      = "marksplit lock since="
	lockTimeout       = time.Second
)

// HeldError is the error of a claim that another agent holds: one line that
// names the holder and what it keeps.
type HeldError struct{ msg string }

func (e *HeldError) Error() string { return e.msg }

// Lock is a claim on a table and a priority.
type Lock struct {
	ln   *net.UnixListener
	done chan struct{}
	// ignored names the first maxNamed lock sockets of unprivileged users
	// that were passed over, for a warning; ignoredN counts them all.
	ignored  []string
	ignoredN int
}

// ignore notes a lock socket of an unprivileged user, passed over.
func (l *Lock) ignore(name string, uid uint32) {
	if l.ignoredN++; len(l.ignored) < maxNamed {
		l.ignored = append(l.ignored, fmt.Sprintf("%q (uid %d)", name, uid))
	}
}

// Release gives the lock up and waits for its goroutine; it is safe twice.
func (l *Lock) Release() {
	l.ln.Close()
	<-l.done
}

// Warning is the line to log when the claim passed over lock sockets that
// unprivileged users hold (someone tried to keep the agent from starting),
// or "" when it passed over none.
func (l *Lock) Warning() string {
	if len(l.ignored) == 0 {
		return ""
	}
	more := ""
	if n := l.ignoredN - len(l.ignored); n > 0 {
		more = fmt.Sprintf(" and %d more", n)
	}
	return "ignored lock sockets held by unprivileged users (only a marksplit run by root, or by this user, keeps a table or a priority): " + strings.Join(l.ignored, ", ") + more
}

// Claim claims table t and priority p in the network namespace the
// process runs in, for as long as the process lives or until Release. A
// claim another agent holds fails with a *HeldError naming it.
func Claim(t, p uint32) (*Lock, error) {
	var nonce [8]byte
	rand.Read(nonce[:])
	name := fmt.Sprintf("%stable=%d/priority=%d/%s", agentLockPrefix, uint64(t), uint64(p), hex.EncodeToString(nonce[:]))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("claim table %d and priority %d in this network namespace: %w", uint64(t), uint64(p), err)
	}
	since := monotonicNow()
	l := &Lock{ln: ln, done: make(chan struct{})}
	go l.serve(since)
	socks, err := listLockSockets()
	if err != nil {
		l.Release()
		return nil, fmt.Errorf("claim table %d and priority %d in this network namespace: %w", uint64(t), uint64(p), err)
	}
	me := uint32(os.Geteuid())
	for _, s := range socks {
		if s.name == name {
			continue
		}
		table, prio, hasPrio, ok := parseLockName(s.name)
		if !ok || (table != uint64(t) && (!hasPrio || prio != uint64(p))) {
			continue
		}
		if s.uidKnown && s.uid != 0 && s.uid != me {
			l.ignore(s.name, s.uid)
			continue
		}
		h, alive := askHolder(s.name)
		switch {
		case !alive:
			continue // gone since the list
		case h.uidKnown && h.uid != 0 && h.uid != me:
			l.ignore(s.name, h.uid)
			continue
		case h.marksplit && (h.since > since || h.since == since && s.name > name):
			continue // it came after us, and yields
		}
		l.Release()
		return nil, &HeldError{heldMessage(t, p, table, prio, hasPrio, h)}
	}
	return l, nil
}

// serve answers each connection with the time the lock was taken.
func (l *Lock) serve(since int64) {
	defer close(l.done)
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		c.SetWriteDeadline(time.Now().Add(lockTimeout))
		fmt.Fprintf(c, "%s%d\n", lockGreeting, since)
		c.Close()
	}
}

// monotonicNow is CLOCK_MONOTONIC in nanoseconds: one clock for every
// process on the host.
func monotonicNow() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// parseLockName reads the table and priority a lock socket's name claims;
// a legacy name claims a table only.
func parseLockName(name string) (table, prio uint64, hasPrio, ok bool) {
	if rest, found := strings.CutPrefix(name, legacyTablePrefix); found {
		table, err := strconv.ParseUint(rest, 10, 32)
		return table, 0, false, err == nil
	}
	rest, found := strings.CutPrefix(name, agentLockPrefix+"table=")
	if !found {
		return 0, 0, false, false
	}
	ts, rest, _ := strings.Cut(rest, "/priority=")
	ps, _, _ := strings.Cut(rest, "/")
	table, err1 := strconv.ParseUint(ts, 10, 32)
	prio, err2 := strconv.ParseUint(ps, 10, 32)
	return table, prio, true, err1 == nil && err2 == nil
}

// lockHolder is what a privileged lock socket's owner says of itself.
type lockHolder struct {
	pid       int32 // 0: in another PID namespace, or not known
	uid       uint32
	uidKnown  bool
	comm      string
	marksplit bool  // it answered as a marksplit does
	silent    bool  // it said nothing within lockTimeout
	stopped   bool  // silent, and its process is stopped (SIGSTOP) or traced
	since     int64 // when it took the lock (a legacy holder: 0)
	err       error // why it is not known
}

// askHolder connects to the socket name and reads who holds it; alive is
// false when no one listens there any more.
func askHolder(name string) (h lockHolder, alive bool) {
	ctx, cancel := context.WithTimeout(context.Background(), lockTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", name)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return h, false
	}
	if err != nil {
		h.err = err
		return h, true
	}
	defer c.Close()
	if rc, err := c.(*net.UnixConn).SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				h.pid, h.uid, h.uidKnown = cred.Pid, cred.Uid, true
			}
		})
	}
	if h.pid != 0 {
		if comm, err := os.ReadFile("/proc/" + strconv.Itoa(int(h.pid)) + "/comm"); err == nil {
			h.comm = textsafe.Terminal(strings.TrimSuffix(string(comm), "\n"))
		}
	}
	c.SetReadDeadline(time.Now().Add(lockTimeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	switch {
	case strings.HasPrefix(line, lockGreeting):
		h.since, err = strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, lockGreeting)), 10, 64)
		h.marksplit = err == nil
	case line == "" && errors.Is(err, os.ErrDeadlineExceeded):
		// Nothing at all: stopped, hung, or not a marksplit.
		h.silent = true
		h.stopped = h.pid != 0 && stopped(h.pid)
	case line != "":
		// Not a marksplit: it says something else.
	case strings.HasPrefix(name, legacyTablePrefix):
		// An earlier version closes at once without a word.
		h.marksplit = true
	default:
		// Closed without a word: a claimant that yielded, or an agent
		// that stopped, after we connected.
		return h, false
	}
	return h, true
}

// stopped reports whether process pid is stopped or traced: the state in
// /proc/PID/stat, after the command's closing parenthesis.
func stopped(pid int32) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'T' || b[i+2] == 't'
}

// heldMessage is the one line that says which process holds what.
func heldMessage(t, p uint32, table, prio uint64, hasPrio bool, h lockHolder) string {
	var what string
	switch {
	case table == uint64(t) && hasPrio && prio == uint64(p):
		what = fmt.Sprintf("table %d and priority %d in this network namespace are kept by", uint64(t), uint64(p))
	case table == uint64(t) && hasPrio:
		what = fmt.Sprintf("table %d in this network namespace is kept (with priority %d) by", uint64(t), prio)
	case table == uint64(t):
		what = fmt.Sprintf("table %d in this network namespace is kept by", uint64(t))
	default:
		what = fmt.Sprintf("priority %d in this network namespace is kept (with table %d) by", uint64(p), table)
	}
	var who string
	switch {
	case h.marksplit:
		who = "another marksplit"
	case h.stopped && h.comm == "marksplit":
		who = "another marksplit, stopped"
	case h.stopped:
		who = "a stopped privileged process"
	case h.silent:
		who = "a privileged process that does not answer as a marksplit does"
	default:
		who = "a privileged process that is not a marksplit"
	}
	var id string
	switch {
	case h.pid != 0 && h.comm != "":
		id = fmt.Sprintf("pid %d, %s", h.pid, h.comm)
	case h.pid != 0:
		id = fmt.Sprintf("pid %d", h.pid)
	case h.err != nil:
		id = "its process is not known: " + h.err.Error()
	default:
		id = "its process is in another PID namespace"
	}
	return fmt.Sprintf("%s %s (%s): one agent per table and per priority in a network namespace", what, who, id)
}

// lockSocket is a listening unix socket under lockPrefix and its owner.
type lockSocket struct {
	name     string
	uid      uint32
	uidKnown bool
}

// listLockSockets lists the listening unix sockets of the network
// namespace whose name begins with lockPrefix, each with its owner's uid,
// from the kernel's socket diagnostics (which need no privilege); without
// them (a kernel without unix_diag), from /proc/net/unix, which does not
// say who owns a socket.
func listLockSockets() ([]lockSocket, error) {
	socks, err := diagLockSockets()
	if err == nil {
		return socks, nil
	}
	if socks, perr := procLockSockets(); perr == nil {
		return socks, nil
	}
	return nil, err
}

// diagLockSockets is listLockSockets by NETLINK_SOCK_DIAG.
func diagLockSockets() ([]lockSocket, error) {
	c, err := sockdiag.Dial(0)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	all, err := c.UnixListeners()
	if err != nil {
		return nil, err
	}
	var socks []lockSocket
	for _, s := range all {
		if strings.HasPrefix(s.Name, lockPrefix) {
			socks = append(socks, lockSocket{name: s.Name, uid: s.UID, uidKnown: s.UIDKnown})
		}
	}
	return socks, nil
}

// procLockSockets is listLockSockets by /proc/net/unix, whose lines end
// in the flags (0x10000: listening), type, state, inode and name.
func procLockSockets() ([]lockSocket, error) {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return nil, err
	}
	var socks []lockSocket
	for l := range strings.Lines(string(b)) {
		f := strings.Fields(l)
		if len(f) >= 8 && f[3] == "00010000" && strings.HasPrefix(f[7], lockPrefix) {
			socks = append(socks, lockSocket{name: f[7]})
		}
	}
	return socks, nil
}

// maxNamed is how many ignored sockets Warning names; it counts the others.
const maxNamed = 3
