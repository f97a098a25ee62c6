package wgpeers

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// MinInterval is the shortest poll interval the agent accepts: a read of a
// device with a thousand peers is a few hundred kilobytes of netlink, and
// nothing that depends on the routes changes faster than a WireGuard
// handshake (seconds).
const MinInterval = 100 * time.Millisecond

// DefaultInterval is the agent's poll interval: a peer added, removed or
// roamed shows in the routes within about a second, as Cilium's own
// route reconciler re-asserts its routes.
const DefaultInterval = time.Second

// Source polls one WireGuard device and reports it when it changes.
type Source struct {
	// Open returns a new client (wgctrl.New, in the agent). The source
	// opens one before its first read and again after a read found no
	// device or failed: a client opened before the kernel's wireguard
	// module was loaded never sees its devices.
	Open func() (Client, error)
	// Link is the device's name.
	Link string
	// Interval is the time between two reads; it must be positive.
	Interval time.Duration
	// Logger gets a warning when reads start to fail and a line when they
	// work again; nil for none.
	Logger *slog.Logger
}

// Run reads the device at once and then every Interval until ctx ends,
// and calls report with the first Device read and with each that differs
// from the last reported. A failed read reports nothing: the last Device
// stands. report runs on Run's goroutine.
func (s *Source) Run(ctx context.Context, report func(Device)) {
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var (
		c        Client
		last     Device
		reported bool
		failing  string // the error being logged, "" while reads work
	)
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		d, err := s.read(&c)
		switch {
		case err != nil && err.Error() != failing:
			failing = err.Error()
			log.Warn(failing + "; the last read stands, reading again every " + s.Interval.String())
		case err == nil && failing != "":
			failing = ""
			log.Info("wgpeers: " + s.Link + " read again")
		}
		if err == nil && (!reported || !d.Equal(last)) {
			last, reported = d, true
			report(d)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// read reads the device with *c, opening a client first when there is
// none, and closes it when the read found no device or failed.
func (s *Source) read(c *Client) (Device, error) {
	if *c == nil {
		nc, err := s.Open()
		if err != nil {
			return Device{}, fmt.Errorf("wgpeers: open a client for %s: %w", s.Link, err)
		}
		*c = nc
	}
	d, err := Read(*c, s.Link)
	if err != nil || !d.Exists {
		(*c).Close()
		*c = nil
	}
	return d, err
}
