//go:build linux

package program

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/internal/sockdiag"
	"github.com/marksplit/marksplit/internal/textsafe"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// ownerPrefix begins the name of every lock socket; oldPrefix is the
// name of the agent's lock before this package had it
// ("@marksplit/agent/table=900/priority=900/NONCE"), which a claim also
// binds and scans for, for one release, so that a rolling upgrade never
// runs an old and a new agent at once; legacyTablePrefix is the lock of
// versions that locked the table alone ("@marksplit/table/900"), still
// honoured.
const (
	ownerPrefix       = "@netwatch/owner/"
	oldRoot           = "@marksplit/"
	oldPrefix         = oldRoot + "agent/"
	legacyTablePrefix = oldRoot + "table/"
	ownerGreeting     = "netwatch owner since="
	oldGreeting       = "marksplit lock since="
	lockTimeout       = time.Second
)

// HeldError is the error of a claim that another program holds: one line
// that names the holder and what it keeps.
type HeldError struct{ msg string }

func (e *HeldError) Error() string { return e.msg }

// Lock is a claim on a table and a priority.
type Lock struct {
	lns  []*net.UnixListener // the name, then the old name
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
	if l.done == nil {
		return // a fake kernel's
	}
	for _, ln := range l.lns {
		ln.Close()
	}
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
	return "ignored lock sockets held by unprivileged users (only a program run by root, or by this user, keeps a table or a priority): " + strings.Join(l.ignored, ", ") + more
}

// Claim claims table t and priority p in network namespace ns (nil: the
// process's own) for name, the program's (which a refusal names), for as
// long as the process lives or until Release. A claim another program
// holds fails with a *HeldError naming it. A fake kernel's namespace
// (netwatchtest) has no lock to take: Claim succeeds there.
//
// The claim binds "@netwatch/owner/table=T/priority=P/NONCE" and, for one
// release, the agent's old name "@marksplit/agent/table=T/priority=P/NONCE"
// (which is all an old agent looks for), then lists both kinds.
func Claim(ns *netwatch.NetNS, name string, t reconcile.OwnTable, p reconcile.OwnPriority) (*Lock, error) {
	fd, fake := rtnl.Target((*rtnl.NetNS)(ns))
	if fake != nil {
		return &Lock{}, nil
	}
	var l *Lock
	err := inNetNS(fd, func() error {
		var err error
		l, err = claim(name, uint32(t), uint32(p))
		return err
	})
	return l, err
}

// inNetNS calls fn on a thread in the network namespace fd (0: the
// calling thread's), which it then discards.
func inNetNS(fd int, fn func() error) error {
	if fd == 0 {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter the network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func claim(owner string, t, p uint32) (*Lock, error) {
	var nonce [8]byte
	rand.Read(nonce[:])
	key := fmt.Sprintf("table=%d/priority=%d/%s", uint64(t), uint64(p), hex.EncodeToString(nonce[:]))
	fail := func(err error) error {
		return fmt.Errorf("claim table %d and priority %d in this network namespace: %w", uint64(t), uint64(p), err)
	}
	l := &Lock{done: make(chan struct{})}
	for _, n := range []string{ownerPrefix + key, oldPrefix + key} {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: n, Net: "unix"})
		if err != nil {
			for _, ln := range l.lns {
				ln.Close()
			}
			return nil, fail(err)
		}
		l.lns = append(l.lns, ln)
	}
	since := monotonicNow()
	var wg sync.WaitGroup
	wg.Go(func() { serve(l.lns[0], fmt.Sprintf("%s%d name=%s\n", ownerGreeting, since, owner)) })
	wg.Go(func() { serve(l.lns[1], fmt.Sprintf("%s%d\n", oldGreeting, since)) })
	go func() { wg.Wait(); close(l.done) }()
	socks, err := listLockSockets()
	if err != nil {
		l.Release()
		return nil, fail(err)
	}
	me := uint32(os.Geteuid())
	newNonces := map[string]bool{}
	for _, s := range socks {
		if rest, ok := strings.CutPrefix(s.name, ownerPrefix); ok {
			newNonces[rest[strings.LastIndexByte(rest, '/')+1:]] = true
		}
	}
	for _, s := range socks {
		if s.name == ownerPrefix+key || s.name == oldPrefix+key {
			continue
		}
		if rest, ok := strings.CutPrefix(s.name, oldPrefix); ok && newNonces[rest[strings.LastIndexByte(rest, '/')+1:]] {
			continue // a new claimant's old name: its new one answers for it
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
		case h.owner != "" && (h.since > since || h.since == since && s.name > ownerPrefix+key):
			continue // it came after us, and yields
		}
		l.Release()
		return nil, &HeldError{heldMessage(owner, t, p, table, prio, hasPrio, h)}
	}
	return l, nil
}

// serve answers each connection to ln with greeting.
func serve(ln *net.UnixListener, greeting string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.SetWriteDeadline(time.Now().Add(lockTimeout))
		io.WriteString(c, greeting)
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
	rest, found := strings.CutPrefix(name, ownerPrefix+"table=")
	if !found {
		rest, found = strings.CutPrefix(name, oldPrefix+"table=")
	}
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
	pid      int32 // 0: in another PID namespace, or not known
	uid      uint32
	uidKnown bool
	comm     string
	owner    string // the program it answered as: "" when it did not answer as a lock does
	silent   bool   // it said nothing within lockTimeout
	stopped  bool   // silent, and its process is stopped (SIGSTOP) or traced
	since    int64  // when it took the lock (a legacy holder: 0)
	err      error  // why it is not known
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
	case strings.HasPrefix(line, ownerGreeting):
		since, owner, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(line, ownerGreeting)), " name=")
		if h.since, err = strconv.ParseInt(since, 10, 64); err == nil && owner != "" {
			h.owner = textsafe.Terminal(owner)
		}
	case strings.HasPrefix(line, oldGreeting):
		// An agent of the release before: a marksplit.
		h.since, err = strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, oldGreeting)), 10, 64)
		if err == nil {
			h.owner = "marksplit"
		}
	case line == "" && errors.Is(err, os.ErrDeadlineExceeded):
		// Nothing at all: stopped, hung, or not a marksplit.
		h.silent = true
		h.stopped = h.pid != 0 && stopped(h.pid)
	case line != "":
		// Not a marksplit: it says something else.
	case strings.HasPrefix(name, legacyTablePrefix):
		// An earlier version closes at once without a word.
		h.owner = "marksplit"
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
func heldMessage(owner string, t, p uint32, table, prio uint64, hasPrio bool, h lockHolder) string {
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
	case h.owner == owner:
		who = "another " + owner
	case h.owner != "":
		who = h.owner
	case h.stopped && h.comm == owner:
		who = "another " + owner + ", stopped"
	case h.stopped:
		who = "a stopped privileged process"
	case h.silent:
		who = "a privileged process that does not answer as a lock does"
	default:
		who = "a privileged process that is not a program of this kind"
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
	return fmt.Sprintf("%s %s (%s): one program per table and per priority in a network namespace", what, who, id)
}

// lockSocket is a listening unix socket of a lock and its owner.
type lockSocket struct {
	name     string
	uid      uint32
	uidKnown bool
}

// listLockSockets lists the listening unix sockets of the network
// namespace that are locks' (isLockName), each with its owner's uid,
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
		if isLockName(s.Name) {
			socks = append(socks, lockSocket{name: s.Name, uid: s.UID, uidKnown: s.UIDKnown})
		}
	}
	return socks, nil
}

// procLockSockets is listLockSockets by /proc/net/unix, whose lines end
// in the flags (0x10000: listening), type, state, inode and name.
func procLockSockets() ([]lockSocket, error) {
	b, err := os.ReadFile("/proc/thread-self/net/unix")
	if err != nil {
		return nil, err
	}
	var socks []lockSocket
	for l := range strings.Lines(string(b)) {
		f := strings.Fields(l)
		if len(f) >= 8 && f[3] == "00010000" && isLockName(f[7]) {
			socks = append(socks, lockSocket{name: f[7]})
		}
	}
	return socks, nil
}

// maxNamed is how many ignored sockets Warning names; it counts the others.
const maxNamed = 3

// isLockName reports whether an abstract socket's name is a lock's, of
// this release or the one before.
func isLockName(name string) bool {
	return strings.HasPrefix(name, ownerPrefix) || strings.HasPrefix(name, oldRoot)
}
