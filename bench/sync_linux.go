//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/marksplit/marksplit/netwatch"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The initial-sync contenders, in table order; raw is the floor.
var syncContenders = []string{"raw", "netwatch", "vishvananda-list", "vishvananda-subscribe", "rtnetlink", "ip"}

// childSync runs in a fresh process inside the namespace: one contender
// reads every route once. expect is the number of route messages an
// AF_UNSPEC dump holds (the subscription has no end-of-dump marker).
func childSync(contender string, expect int) (syncResult, error) {
	res := syncResult{Contender: contender, HeapKiB: -1, RetainKiB: -1}
	var keep any
	var mapped int64 // what netwatch holds outside the Go heap
	start := time.Now()
	switch contender {
	case "raw":
		s, err := dialNL()
		if err != nil {
			return res, err
		}
		defer s.Close()
		if res.Routes, err = s.dump(unix.AF_UNSPEC, nil); err != nil {
			return res, err
		}
	case "netwatch":
		w := netwatch.New(netwatch.Options{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- w.Run(ctx) }()
		timeout := time.NewTimer(5 * time.Minute)
		defer timeout.Stop()
		for ch := changed(w); !w.Stats().Synced; ch = changed(w) {
			select {
			case <-ch:
			case err := <-errc:
				return res, fmt.Errorf("netwatch: Run returned %v", err)
			case <-timeout.C:
				return res, errors.New("netwatch: not synced within 5 minutes")
			}
		}
		w.Read(func(v netwatch.View) { res.Routes = routeCount(v) })
		keep = w
		mapped = w.Stats().MappedBytes
	case "vishvananda-list":
		rs, err := vnl.RouteListFiltered(vnl.FAMILY_ALL, &vnl.Route{Table: unix.RT_TABLE_UNSPEC}, vnl.RT_FILTER_TABLE)
		if errors.Is(err, vnl.ErrDumpInterrupted) {
			res.InterruptN++
		} else if err != nil {
			return res, err
		}
		res.Routes = len(rs)
		keep = rs
	case "vishvananda-subscribe":
		ch := make(chan vnl.RouteUpdate, 1024)
		done := make(chan struct{})
		defer close(done)
		errc := make(chan error, 1)
		err := vnl.RouteSubscribeWithOptions(ch, done, vnl.RouteSubscribeOptions{
			ListExisting: true,
			ErrorCallback: func(err error) {
				select {
				case errc <- err:
				default:
				}
			},
		})
		if err != nil {
			return res, err
		}
		var got []vnl.RouteUpdate
		timeout := time.NewTimer(5 * time.Minute)
		defer timeout.Stop()
		for len(got) < expect {
			select {
			case u, ok := <-ch:
				if !ok {
					return res, fmt.Errorf("subscription closed after %d of %d routes", len(got), expect)
				}
				got = append(got, u)
			case err := <-errc:
				return res, fmt.Errorf("subscription error after %d of %d routes: %w", len(got), expect, err)
			case <-timeout.C:
				return res, fmt.Errorf("%d of %d routes within 5 minutes", len(got), expect)
			}
		}
		res.Routes = len(got)
		keep = got
	case "rtnetlink":
		c, err := rtnetlink.Dial(nil)
		if err != nil {
			return res, err
		}
		defer c.Close()
		rs, err := c.Route.List()
		if err != nil {
			return res, err
		}
		res.Routes = len(rs)
		keep = rs
	case "ip":
		return ipShow(res)
	default:
		return res, fmt.Errorf("unknown contender %q", contender)
	}
	res.WallNS = int64(time.Since(start))
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapKiB = int64(ms.HeapAlloc+uint64(mapped)) >> 10
	runtime.GC()
	runtime.ReadMemStats(&ms)
	res.RetainKiB = int64(ms.HeapAlloc+uint64(mapped)) >> 10
	runtime.KeepAlive(keep)
	hwm, err := vmHWM()
	res.HWMKiB = hwm
	return res, err
}

// ipShow runs `ip -j route show table all`, reads its output through a
// pipe as a consumer would, and counts the routes in it.
func ipShow(res syncResult) (syncResult, error) {
	start := time.Now()
	cmd := exec.Command("ip", "-j", "route", "show", "table", "all")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return res, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return res, err
	}
	n, err := countDst(out)
	if werr := cmd.Wait(); werr != nil {
		return res, fmt.Errorf("ip: %w: %s", werr, bytes.TrimSpace(stderr.Bytes()))
	}
	if err != nil {
		return res, err
	}
	res.WallNS = int64(time.Since(start))
	res.Routes = n
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.HWMKiB = ru.Maxrss // KiB on Linux
	}
	return res, nil
}

// countDst counts `"dst":` in a stream of ip -j output, one per route.
func countDst(r io.Reader) (int, error) {
	needle := []byte(`"dst":`)
	br := bufio.NewReaderSize(r, 256<<10)
	buf := make([]byte, 256<<10)
	carry := 0
	n := 0
	for {
		m, err := br.Read(buf[carry:])
		chunk := buf[:carry+m]
		n += bytes.Count(chunk, needle)
		// Keep a tail shorter than the needle: it cannot hold a whole
		// match already counted.
		carry = min(len(needle)-1, len(chunk))
		copy(buf, chunk[len(chunk)-carry:])
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// vmHWM reads the process's peak resident set size.
func vmHWM() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}

// vnlKey is a vishvananda route's key, as parseRoute makes the kernel's.
func vnlKey(r *vnl.Route) (routeKey, bool) {
	if r.Family != unix.AF_INET {
		return routeKey{}, false
	}
	k := routeKey{Table: uint32(r.Table), TOS: uint8(r.Tos), Priority: uint32(r.Priority)}
	if r.Dst == nil {
		k.Dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		return k, true
	}
	a, ok := netip.AddrFromSlice(r.Dst.IP.To4())
	if !ok {
		return k, false
	}
	bits, _ := r.Dst.Mask.Size()
	k.Dst = netip.PrefixFrom(a, bits).Masked()
	return k, true
}

// rtnlKey is an rtnetlink route message's key.
func rtnlKey(m *rtnetlink.RouteMessage) (routeKey, bool) {
	if m.Family != unix.AF_INET {
		return routeKey{}, false
	}
	k := routeKey{Table: m.Attributes.Table, TOS: m.Tos, Priority: m.Attributes.Priority}
	if k.Table == 0 {
		k.Table = uint32(m.Table)
	}
	a := netip.IPv4Unspecified()
	if m.Attributes.Dst != nil {
		var ok bool
		if a, ok = netip.AddrFromSlice(m.Attributes.Dst.To4()); !ok {
			return k, false
		}
	}
	k.Dst = netip.PrefixFrom(a, int(m.DstLength)).Masked()
	return k, true
}
