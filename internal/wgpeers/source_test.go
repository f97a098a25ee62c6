package wgpeers

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/netwatch"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func netwatchMark(m uint32) netwatch.Mark { return netwatch.Mark(m) }

// answer is one scripted read: a device, or an error.
type answer struct {
	dev *wgtypes.Device // nil with a nil err: no such device
	err error
}

// scriptedClient answers each Device call with the next answer the test
// sends, so the test decides every read: nothing depends on the interval.
type scriptedClient struct {
	answers <-chan answer
	done    <-chan struct{}
	mu      *sync.Mutex
	closes  *int
}

func (s scriptedClient) Device(string) (*wgtypes.Device, error) {
	select {
	case a := <-s.answers:
		if a.dev == nil && a.err == nil {
			return nil, errNotExist
		}
		return a.dev, a.err
	case <-s.done:
		return nil, errors.New("test over")
	}
}

func (s scriptedClient) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.closes++
	return nil
}

func TestSource(t *testing.T) {
	answers := make(chan answer)
	done := make(chan struct{})
	var mu sync.Mutex
	opens, closes := 0, 0
	src := &Source{
		Link:     "wg0",
		Interval: time.Nanosecond, // the script paces the reads
		Open: func() (Client, error) {
			mu.Lock()
			defer mu.Unlock()
			opens++
			return scriptedClient{answers: answers, done: done, mu: &mu, closes: &closes}, nil
		},
	}
	reports := make(chan Device, 16)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		src.Run(ctx, func(d Device) { reports <- d })
	}()
	send := func(a answer) {
		t.Helper()
		select {
		case answers <- a:
		case <-time.After(time.Minute):
			t.Fatal("the source did not read within a minute")
		}
	}
	next := func() Device {
		t.Helper()
		select {
		case d := <-reports:
			return d
		case <-time.After(time.Minute):
			t.Fatal("no report within a minute")
		}
		return Device{}
	}
	peer := func(b byte, ep string, allowed ...string) wgtypes.Peer {
		p := wgtypes.Peer{PublicKey: key(b)}
		if ep != "" {
			p.Endpoint = udpAddr(ep)
		}
		for _, a := range allowed {
			p.AllowedIPs = append(p.AllowedIPs, ipnet(a))
		}
		return p
	}
	one := &wgtypes.Device{FirewallMark: 0x1e00, Peers: []wgtypes.Peer{peer(1, "10.0.0.9:51871", "10.244.9.0/24")}}
	two := &wgtypes.Device{FirewallMark: 0x1e00, Peers: []wgtypes.Peer{peer(1, "10.0.0.9:51871", "10.244.9.0/24"), peer(2, "", "10.244.8.0/24")}}
	roamed := &wgtypes.Device{FirewallMark: 0x1e00, Peers: []wgtypes.Peer{peer(1, "10.0.1.9:4000", "10.244.9.0/24"), peer(2, "", "10.244.8.0/24")}}

	// A missing device is a read: reported, and the client is reopened.
	send(answer{})
	if d := next(); d.Exists {
		t.Fatalf("first report %+v, want a device that does not exist", d)
	}
	send(answer{dev: one})
	if d := next(); !d.Exists || len(d.Peers) != 1 {
		t.Fatalf("report %+v, want the device with one peer", d)
	}
	// The same device again: no report. A failure: no report either, and
	// the next good read that differs is reported.
	send(answer{dev: one})
	send(answer{err: errors.New("connection refused")})
	send(answer{dev: two})
	if d := next(); len(d.Peers) != 2 {
		t.Fatalf("report %+v, want two peers", d)
	}
	send(answer{dev: roamed})
	d := next()
	if got, want := d.Peers[0].Endpoint, netip.MustParseAddrPort("10.0.1.9:4000"); got != want {
		t.Fatalf("endpoint after the roam: %v, want %v", got, want)
	}
	// Opened for the first read, again after the missing device and after
	// the failure, and closed after each of those two.
	mu.Lock()
	if diff := cmp.Diff([2]int{3, 2}, [2]int{opens, closes}); diff != "" {
		t.Errorf("opens and closes before the end (-want +got):\n%s", diff)
	}
	mu.Unlock()
	send(answer{dev: roamed}) // the loop has passed the last report's send before stopping
	cancel()
	close(done)
	select {
	case <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of its context's end")
	}
	close(reports)
	var extra []Device
	for d := range reports {
		extra = append(extra, d)
	}
	if len(extra) > 0 {
		t.Errorf("reports of unchanged devices: %+v", extra)
	}
	mu.Lock()
	defer mu.Unlock()
	// Every client closed, the last one by Run's end.
	if opens != closes {
		t.Errorf("%d clients opened, %d closed", opens, closes)
	}
}

func TestSourceOpenFails(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	opens := make(chan struct{})
	src := &Source{Link: "wg0", Interval: time.Nanosecond, Open: func() (Client, error) {
		select {
		case opens <- struct{}{}:
		case <-ctx.Done():
		}
		return nil, errors.New("no netlink")
	}}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		src.Run(ctx, func(d Device) { t.Errorf("reported %+v without a read", d) })
	}()
	for range 3 {
		select {
		case <-opens:
		case <-time.After(time.Minute):
			t.Fatal("the source did not try to open a client again")
		}
	}
	cancel()
	<-stopped
}
