//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/mdlayher/netlink"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The event consumers, in table order; raw is the floor.
var churnContenders = []string{"raw", "netwatch", "vishvananda-subscribe", "rtnetlink", "ip-monitor"}

// tally counts a consumer's events and stamps the first and last.
type tally struct {
	n, first, last, enobufs atomic.Int64
	mu                      sync.Mutex
	errs                    []string
	enobufsIs               bool
	died                    bool
	diedAfter               int64
}

func (t *tally) add(k int64) {
	now := time.Now().UnixNano()
	t.first.CompareAndSwap(0, now)
	t.last.Store(now)
	t.n.Add(k)
}

func (t *tally) error(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if errors.Is(err, unix.ENOBUFS) {
		t.enobufsIs = true
	}
	// Go's errno text is lower case, ip's strerror starts with a capital.
	if strings.Contains(strings.ToLower(err.Error()), unix.ENOBUFS.Error()) {
		t.enobufs.Add(1)
	}
	s := err.Error()
	for _, e := range t.errs {
		if e == s {
			return
		}
	}
	if len(t.errs) < 4 {
		t.errs = append(t.errs, s)
	}
}

// consumer is one way of following route events.
type consumer interface {
	// sync subscribes and reads the existing routes.
	sync(rcvbuf, existing int) error
	// run follows events until stop.
	run()
	stop()
	// routes returns the consumer's IPv4 routes, or nil if it keeps none.
	routes() map[routeKey]struct{}
	rcvBuf() int
}

// childChurn runs in a fresh process inside the namespace: it syncs,
// prints "ready", follows events until the parent's "done WRITERS_END_NS"
// line and quiet (or until all expected events arrived), then compares its
// routes with the kernel's and prints its result.
func childChurn(contender string, rcvbuf, existing int, expected int64) (churnResult, error) {
	res := churnResult{Contender: contender, Expected: expected, Diverged: -1}
	var t tally
	var c consumer
	switch contender {
	case "raw":
		c = &rawConsumer{t: &t}
	case "netwatch":
		c = &netwatchConsumer{t: &t}
	case "vishvananda-subscribe":
		c = &vnlConsumer{t: &t}
	case "rtnetlink":
		c = &rtnlConsumer{t: &t}
	case "ip-monitor":
		c = &ipMonitor{t: &t}
	default:
		return res, fmt.Errorf("unknown consumer %q", contender)
	}
	if err := c.sync(rcvbuf, existing); err != nil {
		return res, err
	}
	if dir := os.Getenv("BENCH_CPUPROFILE"); dir != "" {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", contender, rcvbuf)))
		if err != nil {
			return res, err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	ran := make(chan struct{})
	go func() { defer close(ran); c.run() }()
	fmt.Println("ready")

	done := make(chan int64, 1)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "done "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				done <- n
				return
			}
		}
	}()
	const quiet = 500 * time.Millisecond
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var writersEnd int64
	var deadline time.Time
	for {
		<-tick.C
		select {
		case writersEnd = <-done:
			deadline = time.Now().Add(30 * time.Second)
		default:
		}
		// netwatch's count comes from Stats, read only once quiet: see
		// netwatchConsumer.count.
		if t.n.Load() >= expected {
			break
		}
		if writersEnd != 0 {
			last := max(t.last.Load(), writersEnd)
			if time.Since(time.Unix(0, last)) > quiet || time.Now().After(deadline) {
				break
			}
		}
	}
	if writersEnd == 0 {
		writersEnd = <-done
	}
	c.stop()
	<-ran
	if nc, ok := c.(interface{ count() int64 }); ok {
		t.n.Store(nc.count())
	}
	res.RcvBuf = c.rcvBuf()
	res.Events, res.FirstNS, res.LastNS, res.WritersEndNS = t.n.Load(), t.first.Load(), t.last.Load(), writersEnd
	res.ENOBUFS, res.ENOBUFSIs, res.Errors, res.Died, res.DiedAfter = t.enobufs.Load(), t.enobufsIs, t.errs, t.died, t.diedAfter
	if nw, ok := c.(*netwatchConsumer); ok {
		st := nw.w.Stats()
		res.Resyncs = st.Resyncs["overflow"]
		res.ENOBUFS = int64(res.Resyncs) // it resyncs on each ENOBUFS it reads
		res.ResyncsAll = make(map[string]uint64)
		for k, v := range st.Resyncs {
			res.ResyncsAll[k] = v
		}
	}
	if mine := c.routes(); mine != nil {
		s, err := dialNL()
		if err != nil {
			return res, err
		}
		defer s.Close()
		kernel, err := s.kernelRoutes4()
		if err != nil {
			return res, err
		}
		res.Diverged = symDiff(mine, kernel)
	}
	return res, nil
}

// rawConsumer reads the IPv4 route group and counts messages: the floor.
type rawConsumer struct {
	t       *tally
	s       *nlSock
	stopped atomic.Bool
}

func (c *rawConsumer) sync(rcvbuf, _ int) error {
	s, err := dialNL(unix.RTNLGRP_IPV4_ROUTE)
	if err != nil {
		return err
	}
	if rcvbuf > 0 {
		if err := s.setRcvBuf(rcvbuf); err != nil {
			return err
		}
	}
	c.s = s
	return s.setRecvTimeout(20 * time.Millisecond)
}

func (c *rawConsumer) run() {
	buf := make([]byte, 64<<10)
	for !c.stopped.Load() {
		n, err := unix.Read(c.s.fd, buf)
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			c.t.error(err)
			if !errors.Is(err, unix.ENOBUFS) {
				return
			}
			continue
		}
		k := int64(0)
		for m := buf[:n]; len(m) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(m))
			if l < unix.NLMSG_HDRLEN || l > len(m) {
				break
			}
			k++
			m = m[align4(l):]
		}
		c.t.add(k)
	}
}

func (c *rawConsumer) stop()                         { c.stopped.Store(true) }
func (c *rawConsumer) routes() map[routeKey]struct{} { return nil }
func (c *rawConsumer) rcvBuf() int                   { return c.s.rcvBuf() }

// netwatchConsumer is a Watcher, read the way the agent reads it: Changed
// says something changed, Stats counts.
type netwatchConsumer struct {
	t      *tally
	w      *netwatch.Watcher
	cancel context.CancelFunc
	done   chan struct{} // Run returned
	quit   chan struct{} // stop was called
	base   uint64
}

func (c *netwatchConsumer) sync(rcvbuf, _ int) error {
	c.w = netwatch.New(netwatch.Options{ReadBuffer: rcvbuf})
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.done = make(chan struct{})
	c.quit = make(chan struct{})
	go func() { defer close(c.done); c.w.Run(ctx) }()
	timeout := time.After(5 * time.Minute)
	if err := c.waitSynced(timeout); err != nil {
		return err
	}
	c.base = c.w.Stats().Events[netwatch.KindRoute]
	return nil
}

// changed is the channel closed at the cache's next change.
func changed(w *netwatch.Watcher) (ch <-chan struct{}) {
	w.Read(func(v netwatch.View) { ch = v.Changed() })
	return ch
}

func (c *netwatchConsumer) waitSynced(timeout <-chan time.Time) error {
	for ch := changed(c.w); !c.w.Stats().Synced; ch = changed(c.w) {
		select {
		case <-ch:
		case <-timeout:
			return errors.New("netwatch: not synced within 5 minutes")
		}
	}
	return nil
}

func (c *netwatchConsumer) run() {
	for {
		select {
		case <-changed(c.w):
			c.t.add(0)
		case <-c.quit:
			return
		}
	}
}

// count reads the route events the watcher applied. Stats is called only
// after the churn, so that the count costs the watcher nothing during it.
func (c *netwatchConsumer) count() int64 {
	return int64(c.w.Stats().Events[netwatch.KindRoute] - c.base)
}

func (c *netwatchConsumer) stop() {
	close(c.quit)
	// Leave the watcher running until its routes are compared; a
	// watcher that is not synced has nothing to compare.
	deadline := time.Now().Add(10 * time.Second)
	for ch := changed(c.w); !c.w.Stats().Synced && time.Now().Before(deadline); ch = changed(c.w) {
		select {
		case <-ch:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (c *netwatchConsumer) routes() map[routeKey]struct{} {
	defer func() { c.cancel(); <-c.done }()
	set := make(map[routeKey]struct{})
	c.w.Read(func(v netwatch.View) {
		if !v.Synced() {
			return
		}
		for _, tb := range v.Tables(netwatch.IPv4) {
			for r := range v.Routes(netwatch.IPv4, tb) {
				set[routeKey{Table: uint32(r.Table), Dst: r.Dst, TOS: r.TOS, Priority: r.Metric}] = struct{}{}
			}
		}
	})
	return set
}

func (c *netwatchConsumer) rcvBuf() int { return 0 }

// vnlConsumer is vishvananda/netlink's RouteSubscribeWithOptions with
// ListExisting, keeping the routes in a map as a cache would.
type vnlConsumer struct {
	t        *tally
	ch       chan vnl.RouteUpdate
	done     chan struct{}
	stopping atomic.Bool
	mu       sync.Mutex
	set      map[routeKey]struct{}
	buf      int
}

func (c *vnlConsumer) apply(u vnl.RouteUpdate) {
	k, ok := vnlKey(&u.Route)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if u.Type == unix.RTM_DELROUTE {
		delete(c.set, k)
	} else {
		c.set[k] = struct{}{}
	}
}

func (c *vnlConsumer) sync(rcvbuf, existing int) error {
	c.ch = make(chan vnl.RouteUpdate, 1024)
	c.done = make(chan struct{})
	c.set = make(map[routeKey]struct{})
	c.buf = rcvbuf
	errc := make(chan error, 1)
	err := vnl.RouteSubscribeWithOptions(c.ch, c.done, vnl.RouteSubscribeOptions{
		ListExisting:           true,
		ReceiveBufferSize:      rcvbuf,
		ReceiveBufferForceSize: rcvbuf > 0,
		ErrorCallback: func(err error) {
			if c.stopping.Load() {
				return
			}
			c.t.error(err)
			select {
			case errc <- err:
			default:
			}
		},
	})
	if err != nil {
		return err
	}
	timeout := time.After(5 * time.Minute)
	for n := 0; n < existing; n++ {
		select {
		case u, ok := <-c.ch:
			if !ok {
				return fmt.Errorf("vishvananda: subscription closed after %d of %d routes", n, existing)
			}
			c.apply(u)
		case err := <-errc:
			return fmt.Errorf("vishvananda: %w", err)
		case <-timeout:
			return fmt.Errorf("vishvananda: %d of %d routes within 5 minutes", n, existing)
		}
	}
	return nil
}

func (c *vnlConsumer) run() {
	for u := range c.ch {
		c.apply(u)
		c.t.add(1)
	}
	if !c.stopping.Load() {
		c.t.mu.Lock()
		c.t.died, c.t.diedAfter = true, c.t.n.Load()
		c.t.mu.Unlock()
	}
}

func (c *vnlConsumer) stop() {
	c.stopping.Store(true)
	close(c.done)
}

func (c *vnlConsumer) routes() map[routeKey]struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.set
}

func (c *vnlConsumer) rcvBuf() int { return 0 }

// rtnlConsumer decodes the IPv4 route group with jsimonetti/rtnetlink's
// RouteMessage on a mdlayher/netlink conn (rtnetlink.Conn cannot size its
// buffer), after a Route.List(), keeping the routes in a map.
type rtnlConsumer struct {
	t        *tally
	c        *netlink.Conn
	stopping atomic.Bool
	set      map[routeKey]struct{}
}

func (c *rtnlConsumer) sync(rcvbuf, _ int) error {
	conn, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{Groups: 1 << (unix.RTNLGRP_IPV4_ROUTE - 1)})
	if err != nil {
		return err
	}
	c.c = conn
	if rcvbuf > 0 {
		if err := conn.SetReadBuffer(rcvbuf); err != nil {
			return err
		}
	}
	lc, err := rtnetlink.Dial(nil)
	if err != nil {
		return err
	}
	defer lc.Close()
	rs, err := lc.Route.List()
	if err != nil {
		return err
	}
	c.set = make(map[routeKey]struct{}, len(rs))
	for i := range rs {
		if k, ok := rtnlKey(&rs[i]); ok {
			c.set[k] = struct{}{}
		}
	}
	return nil
}

func (c *rtnlConsumer) run() {
	for {
		msgs, err := c.c.Receive()
		if err != nil {
			if c.stopping.Load() {
				return
			}
			c.t.error(err)
			if errors.Is(err, unix.ENOBUFS) {
				continue // what a loop that only logs does
			}
			return
		}
		for _, m := range msgs {
			var rm rtnetlink.RouteMessage
			if err := rm.UnmarshalBinary(m.Data); err != nil {
				c.t.error(err)
				continue
			}
			k, ok := rtnlKey(&rm)
			if !ok {
				continue
			}
			if m.Header.Type == unix.RTM_DELROUTE {
				delete(c.set, k)
			} else {
				c.set[k] = struct{}{}
			}
		}
		c.t.add(int64(len(msgs)))
	}
}

func (c *rtnlConsumer) stop() {
	c.stopping.Store(true)
	c.c.SetReadDeadline(time.Unix(1, 0))
}

func (c *rtnlConsumer) routes() map[routeKey]struct{} {
	defer c.c.Close()
	return c.set
}

func (c *rtnlConsumer) rcvBuf() int { return 0 }

// ipMonitor is `ip monitor route`, counted line by line.
type ipMonitor struct {
	t    *tally
	cmd  *exec.Cmd
	done chan struct{}
}

func (c *ipMonitor) sync(rcvbuf, _ int) error {
	args := []string{"monitor", "route"}
	if rcvbuf > 0 {
		args = append([]string{"-rcvbuf", strconv.Itoa(rcvbuf)}, args...)
	}
	c.cmd = exec.Command("ip", args...)
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	errOut, err := c.cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := c.cmd.Start(); err != nil {
		return err
	}
	c.done = make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.t.add(1)
		}
	}()
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(errOut)
		for sc.Scan() {
			c.t.error(errors.New(strings.TrimSpace(sc.Text())))
		}
	}()
	go func() { wg.Wait(); c.cmd.Wait(); close(c.done) }()
	// ip has subscribed once its socket shows groups in /proc/net/netlink.
	deadline := time.Now().Add(5 * time.Second)
	for !subscribed(c.cmd.Process.Pid) {
		if time.Now().After(deadline) {
			return errors.New("ip monitor did not subscribe within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// subscribed reports whether the process has a NETLINK_ROUTE socket that
// joined multicast groups.
func subscribed(pid int) bool {
	b, err := os.ReadFile("/proc/net/netlink")
	if err != nil {
		return false
	}
	for l := range strings.Lines(string(b)) {
		// sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
		f := strings.Fields(l)
		if len(f) < 4 || f[1] != "0" || f[2] != strconv.Itoa(pid) {
			continue
		}
		if g, err := strconv.ParseUint(f[3], 16, 32); err == nil && g != 0 {
			return true
		}
	}
	return false
}

func (c *ipMonitor) run() { <-c.done }

func (c *ipMonitor) stop() {
	c.cmd.Process.Kill()
}

func (c *ipMonitor) routes() map[routeKey]struct{} { return nil }
func (c *ipMonitor) rcvBuf() int                   { return 0 }

// churn runs writers that each add k routes of their own range, in
// batches, then delete them, as fast as the kernel acknowledges.
func churn(socks []*nlSock, k, batch int, spec routeSpec) (writerStats, error) {
	var wg sync.WaitGroup
	errs := make([]error, len(socks))
	start := time.Now()
	for w, s := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dsts := make([]netip.Prefix, 0, batch)
			for _, typ := range []uint16{unix.RTM_NEWROUTE, unix.RTM_DELROUTE} {
				for i := 0; i < k; i += batch {
					dsts = dsts[:0]
					for j := i; j < min(i+batch, k); j++ {
						dsts = append(dsts, churnPrefix(w, j))
					}
					if err := s.routeBatch(typ, dsts, spec); err != nil {
						errs[w] = fmt.Errorf("writer %d: %w", w, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	end := time.Now()
	return writerStats{Ops: int64(2 * k * len(socks)), StartNS: start.UnixNano(), EndNS: end.UnixNano()}, errors.Join(errs...)
}

// routeCount is the number of routes v holds, of both families.
func routeCount(v netwatch.View) int {
	n := 0
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		for _, t := range v.Tables(f) {
			for range v.Routes(f, t) {
				n++
			}
		}
	}
	return n
}
