//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/internal/textsafe"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// The health socket (--health-socket): the kubelet's exec probes,
// `marksplit health` (alive: the watcher runs and its cache is synced) and
// `marksplit health --ready` (a pass converged), ask the running agent over
// a unix socket in a directory that only its owner (root, in the DaemonSet)
// may write. No TCP port is involved: another local user can neither take
// the probes' address before the agent nor flood it (issue 38: a squatter
// on 127.0.0.1:9184 made the agent exit, and answered /healthz in its
// place). The socket is 0600 and its directory loses group and other write:
// only root connects, and at most healthConns connections are served at
// once, each for at most healthTimeout.

const (
	healthConns   = 8
	healthTimeout = 5 * time.Second
)

// The requests on the health socket.
const (
	healthLive  = "live"
	healthReady = "ready"
	// healthPathMTU ADDR asks for a peer's path MTU (verify): the answer
	// is one JSON line (pathReport).
	healthPathMTU = "path-mtu"
)

// listenHealth opens the health socket at path: its directory is made (0700)
// when missing, and must be a directory, not a link, of the agent's own user
// (anyone who owns it could put another socket there); its group and other
// write bits are dropped. A socket left there by an agent before is
// replaced; anything else there is an error.
func listenHealth(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("--health-socket: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("--health-socket: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return nil, fmt.Errorf("--health-socket %s: %s is not a directory (%v)", path, dir, fi.Mode().Type())
	case st == nil:
		return nil, fmt.Errorf("--health-socket %s: %s: no owner to check", path, dir)
	case int(st.Uid) != os.Geteuid():
		return nil, fmt.Errorf("--health-socket %s: %s is not the agent's own (uid %d): its owner could replace the socket", path, dir, st.Uid)
	case fi.Mode().Perm()&0o022 != 0:
		if err := os.Chmod(dir, fi.Mode().Perm()&^0o022); err != nil {
			return nil, fmt.Errorf("--health-socket: %w", err)
		}
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("--health-socket %s: there is a %v there, not a socket", path, fi.Mode().Type())
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--health-socket: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("--health-socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--health-socket: %w", err)
	}
	return ln, nil
}

// serveHealth answers the health socket until ctx ends, then closes ln
// (which removes the socket): one request line, "live" or "ready", and one
// answer line, "ok" or "not ok: " and why.
func serveHealth(ctx context.Context, ln *net.UnixListener, healthy, ready func() error, pathMTU func(string) string, log *slog.Logger) {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	sem := make(chan struct{}, healthConns)
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				log.Error("health socket stopped", "err", err)
			}
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close() // healthConns at once already: only root gets here
			continue
		}
		go func() {
			defer func() { <-sem }()
			answerHealth(c, healthy, ready, pathMTU)
		}()
	}
}

func answerHealth(c net.Conn, healthy, ready func() error, pathMTU func(string) string) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(healthTimeout))
	line, err := bufio.NewReader(io.LimitReader(c, 64)).ReadString('\n')
	if err != nil {
		return
	}
	var check func() error
	if q, arg, ok := strings.Cut(strings.TrimSpace(line), " "); ok && q == healthPathMTU && pathMTU != nil {
		io.WriteString(c, pathMTU(arg)+"\n")
		return
	}
	switch strings.TrimSpace(line) {
	case healthLive:
		check = healthy
	case healthReady:
		check = ready
	default:
		io.WriteString(c, "not ok: unknown request\n")
		return
	}
	if err := check(); err != nil {
		io.WriteString(c, "not ok: "+err.Error()+"\n")
		return
	}
	io.WriteString(c, "ok\n")
}

// runHealth is `marksplit health [--ready] [--health-socket PATH]`: it asks
// the running agent and prints "ok" when it is; else its error, the
// agent's answer or why none came, makes the Program exit 1.
func runHealth(o options, stdout io.Writer) error {
	q := healthLive
	if o.ready {
		q = healthReady
	}
	answer, err := askHealth(o.healthSocket, q, healthTimeout)
	switch {
	case err != nil:
		return fmt.Errorf("health: %w", err)
	case answer != "ok":
		return fmt.Errorf("health: %s", textsafe.Terminal(answer))
	}
	fmt.Fprintln(stdout, answer)
	return nil
}

// askHealth asks the agent at path the question q and returns its answer
// line. The agent must run as root or as the caller's user (SO_PEERCRED).
func askHealth(path, q string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return "", err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return "", err
	}
	switch {
	case credErr != nil:
		return "", credErr
	case cred.Uid != 0 && int(cred.Uid) != os.Geteuid():
		return "", fmt.Errorf("%s is served by uid %d (pid %d), not by root: not the agent", path, cred.Uid, cred.Pid)
	}
	if _, err := io.WriteString(c, q+"\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(io.LimitReader(c, 4096)).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("%s: no answer: %w", path, err)
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// listenRetry listens on addr for the listener called name (a flag) until
// it succeeds or ctx ends (then nil). A port that another program holds
// does not stop the agent: the first failure is logged once as a warning,
// every failure counts in failures, and it tries again after 1 s, doubling
// to at most every 30 s.
func listenRetry(ctx context.Context, name, addr string, failures prometheus.Counter, log *slog.Logger) net.Listener {
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(time.Second), backoff.WithMaxInterval(30*time.Second), backoff.WithMaxElapsedTime(0))
	var t *time.Timer
	for tries := 1; ; tries++ {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			if tries > 1 {
				log.Info("--"+name+" "+addr+": listening now", "tries", tries)
			}
			return ln
		}
		failures.Inc()
		if tries == 1 {
			log.Warn("--"+name+" "+addr+": "+err.Error()+": the agent runs without it and tries again (every 30 s at most); the probes use the health socket", "err", err)
		}
		d := b.NextBackOff()
		if t == nil {
			t = time.NewTimer(d)
			defer t.Stop()
		} else {
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
