//go:build linux

package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/netwatch"
)

// lockTable claims table t in the network namespace the process runs in,
// for as long as the process lives or until release: it binds the
// abstract unix socket "@marksplit/table/T". Abstract unix sockets belong
// to a network namespace, and the kernel releases one when its holder
// dies, so a crash leaves no stale lock. A second claim fails with an
// error naming the holder, whose credentials the kernel hands to a
// connecting peer (SO_PEERCRED).
func lockTable(t netwatch.Table) (release func(), err error) {
	name := "@marksplit/table/" + strconv.FormatUint(uint64(t), 10)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("claim table %d in this network namespace: %w", t, err)
		}
		return nil, fmt.Errorf("table %d in this network namespace is kept by another marksplit (%s): one agent per table and namespace", t, holder(name))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A second claimant connects to learn who holds the table.
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return func() { ln.Close(); <-done }, nil
}

// holder describes the process listening on the abstract socket name.
func holder(name string) string {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return "its process is not known: " + err.Error()
	}
	defer c.Close()
	rc, err := c.SyscallConn()
	if err != nil {
		return "its process is not known: " + err.Error()
	}
	var cred *unix.Ucred
	var credErr error
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil || cred.Pid == 0 {
		return "its process is in another PID namespace"
	}
	s := "pid " + strconv.Itoa(int(cred.Pid))
	if comm, err := os.ReadFile("/proc/" + strconv.Itoa(int(cred.Pid)) + "/comm"); err == nil {
		s += ", " + strings.TrimSpace(string(comm))
	}
	return s
}
