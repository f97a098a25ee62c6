package metricsserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// floodEnv makes the test binary an attacker instead of running tests
// (TestMain): "ADDR,N,MODE,FROM" opens N connections to ADDR from the local
// address FROM (empty: any) that never send a byte; MODE "hold" keeps them
// until the server closes them, "again" opens a new one for each the server
// closes. It prints "ready K" once each of the N was tried (K connected) and
// goes on until its standard input closes.
const floodEnv = "MARKSPLIT_TEST_FLOOD"

func flood(v string) int {
	f := strings.Split(v, ",")
	if len(f) != 4 {
		return 2
	}
	addr, mode, from := f[0], f[2], f[3]
	n, _ := strconv.Atoi(f[1])
	var d net.Dialer
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
	var tried sync.WaitGroup
	var ok atomic.Int64
	for range n {
		tried.Add(1)
		go func() {
			first := true
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if first {
					if err == nil {
						ok.Add(1)
					}
					tried.Done()
					first = false
				}
				if err != nil {
					return
				}
				stop := context.AfterFunc(ctx, func() { c.Close() })
				io.Copy(io.Discard, c) // until the server closes it
				stop()
				c.Close()
				if mode != "again" {
					return
				}
			}
		}()
	}
	tried.Wait()
	fmt.Printf("ready %d\n", ok.Load())
	<-ctx.Done()
	return 0
}

// startFlood runs the attacker (floodEnv) as cred's user (nil: ours) until
// the test ends, and returns how many connections it opened at first.
func startFlood(t *testing.T, addr string, n int, mode, from string, cred *syscall.Credential) int {
	t.Helper()
	dir, err := os.MkdirTemp("", "marksplit-flood-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "flood")
	self, err := os.ReadFile(os.Args[0])
	must(t, err)
	must(t, os.WriteFile(bin, self, 0o755))
	must(t, os.Chmod(dir, 0o755)) // for another user
	cmd := exec.Command(bin)
	cmd.Env = []string{fmt.Sprintf("%s=%s,%d,%s,%s", floodEnv, addr, n, mode, from)}
	cmd.Stderr = os.Stderr
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	k, _ := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "ready "))
	if err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("attacker: %q, %v", line, err)
	}
	return k
}

// probeSpec is one of the DaemonSet's httpGet probes.
type probeSpec struct {
	name, host, path string
	timeout          time.Duration
}

// daemonSetProbes are the httpGet probes the DaemonSet had before its exec
// probes over the health socket (issue 38): /healthz and /readyz on
// loopback with a 2 s timeout, what a person with a port-forward or a
// probe of one's own still asks.
func daemonSetProbes(*testing.T) []probeSpec {
	return []probeSpec{
		{name: "startupProbe", host: "127.0.0.1", path: "/healthz", timeout: 2 * time.Second},
		{name: "livenessProbe", host: "127.0.0.1", path: "/healthz", timeout: 2 * time.Second},
		{name: "readinessProbe", host: "127.0.0.1", path: "/readyz", timeout: 2 * time.Second},
	}
}

// startProbes serves Probes (both answering 200) with the agent's limits on
// host:0 until the test ends; it returns the address and the listener.
func startProbes(t *testing.T, host string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	ok := func() error { return nil }
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "up 1\n") })
	go func() {
		defer close(done)
		Serve(ctx, ln, DefaultLimits(), Probes(metrics, ok, ok), nil, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// kubeletGet asks url as the kubelet's httpGet probe does: a new connection
// for each probe, the probe's timeout; a status from 200 to 399 succeeds.
func kubeletGet(url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return errors.New(resp.Status)
	}
	return nil
}

// The kubelet's probes, with the DaemonSet's settings, against the loopback
// listener while the user nobody holds 300 or 10,000 idle connections to it
// (issue 31: 10 of 20 probes timed out beside 300): each probe answers 10 of
// 10, whether the attacker holds its connections or opens a new one for each
// the server sheds.
func TestProbesUnderIdleFlood(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run the attacker as the user nobody")
	}
	probes := daemonSetProbes(t)
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	for _, tc := range []struct {
		conns int
		mode  string
	}{{300, "hold"}, {300, "again"}, {10000, "hold"}} {
		t.Run(fmt.Sprintf("%d %s", tc.conns, tc.mode), func(t *testing.T) {
			if tc.conns > 300 && testing.Short() {
				t.Skip("10,000 connections: not in -short")
			}
			if (tc.conns > 300 || tc.mode == "again") && raceEnabled {
				// The race detector makes the server's accepts several times
				// slower, against the probes' real-time timeout.
				t.Skip("10,000 connections, or a reconnecting flood: not under the race detector")
			}
			addr := startProbes(t, probes[0].host)
			opened := startFlood(t, addr, tc.conns, tc.mode, "", nobody)
			for _, p := range probes {
				answered, slowest := 0, time.Duration(0)
				var last error
				for range 10 {
					start := time.Now()
					if err := kubeletGet("http://"+addr+p.path, p.timeout); err != nil {
						last = err
						continue
					}
					answered++
					slowest = max(slowest, time.Since(start))
				}
				t.Logf("%s (GET %s, timeout %v) beside %d idle connections of uid 65534 (%s): %d/10 answered, slowest %v",
					p.name, p.path, p.timeout, opened, tc.mode, answered, slowest.Round(time.Millisecond))
				if answered != 10 {
					t.Errorf("%s: %d/10 answered, want 10/10; last error: %v", p.name, answered, last)
				}
			}
		})
	}
}

// Authorised scrapes of the secure listener while another address of the
// network holds 300 idle connections to it, opening a new one for each the
// server sheds (issue 31: every authorised scrape timed out): 10 of 10
// scrapes, each on a new connection, answer within Prometheus's default
// scrape timeout.
func TestSecureUnderIdleFlood(t *testing.T) {
	cfg, err := TLSConfig("", "", []string{"marksplit"}, slog.New(slog.DiscardHandler))
	must(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	authorised := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer scraper" {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "up 1\n")
	})
	go func() {
		defer close(done)
		Serve(ctx, ln, DefaultLimits(), authorised, cfg, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); <-done })
	addr := ln.Addr().String()

	// The attacker comes from 127.0.0.2: another client of the network.
	opened := startFlood(t, addr, 300, "again", "127.0.0.2", nil)
	const scrapeTimeout = 10 * time.Second
	answered, slowest := 0, time.Duration(0)
	var last error
	for range 10 {
		hc := &http.Client{Timeout: scrapeTimeout, Transport: &http.Transport{
			DisableKeepAlives: true,
			TLSClientConfig:   cfg.Clone(),
		}}
		hc.Transport.(*http.Transport).TLSClientConfig.InsecureSkipVerify = true
		req, err := http.NewRequest("GET", "https://"+addr+"/metrics", nil)
		must(t, err)
		req.Header.Set("Authorization", "Bearer scraper")
		start := time.Now()
		resp, err := hc.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = errors.New(resp.Status)
			}
		}
		if err != nil {
			last = err
			continue
		}
		answered++
		slowest = max(slowest, time.Since(start))
	}
	t.Logf("authorised scrapes beside %d idle connections from another address (opened again when shed): %d/10 answered, slowest %v",
		opened, answered, slowest.Round(time.Millisecond))
	if answered != 10 {
		t.Errorf("%d/10 authorised scrapes answered, want 10/10; last error: %v", answered, last)
	}
}
