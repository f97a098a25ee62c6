//go:build linux

package netwatch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// errNotRunning is Barrier's error while the watcher has no session: Run
// has not started, has returned, or is reconnecting.
var errNotRunning = errors.New("netwatch: watcher not running")

// Barrier returns once the cache holds every change the kernel made before
// the call, or with ctx's error when ctx ends first. A program that has
// just changed the kernel calls it to plan its next step from a view that
// shows its own changes, instead of from one that lags behind them.
//
// It sends a request on the watcher's multicast socket: the kernel queues
// the reply behind the events already queued there, so the watcher has
// applied them when it reads the reply. After a resync on a new socket it
// returns once the re-dump is in.
func (w *Watcher) Barrier(ctx context.Context) error {
	w.kickMu.Lock()
	mc, gen := w.kick, w.kickGen
	w.kickMu.Unlock()
	if mc == nil {
		return errNotRunning
	}
	seq, done := w.bar.add(gen)
	if err := sendBarrier(mc, seq); err != nil {
		w.bar.drop(seq)
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		w.bar.drop(seq)
		return ctx.Err()
	}
}

// sendBarrier sends, on the multicast socket mc, a request whose reply
// queues behind the events already queued there: RTM_GETLINK of index 1,
// the loopback link every namespace has, which changes nothing.
func sendBarrier(mc rtnl.Conn, seq uint32) error {
	req := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(req[4:8], 1)
	if _, err := mc.Send(netlink.Message{Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request, Sequence: seq}, Data: req}); err != nil {
		return fmt.Errorf("netwatch: barrier: %w", err)
	}
	return nil
}

// barriers are the Barrier calls waiting for their replies.
type barriers struct {
	mu      sync.Mutex
	seq     uint32
	waiting map[uint32]barrier
}

type barrier struct {
	gen  uint64     // of the multicast socket the request went out on
	done chan error // buffered; receives once
}

func (b *barriers) add(gen uint64) (uint32, chan error) {
	seq := b.next()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waiting == nil {
		b.waiting = make(map[uint32]barrier)
	}
	done := make(chan error, 1)
	b.waiting[seq] = barrier{gen: gen, done: done}
	return seq, done
}

// next returns a request sequence number no other barrier uses.
func (b *barriers) next() uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	if b.seq == 0 {
		b.seq++
	}
	return b.seq
}

func (b *barriers) drop(seq uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.waiting, seq)
}

// release ends the barriers whose replies the watcher has read.
func (b *barriers) release(seqs []uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range seqs {
		if x, ok := b.waiting[s]; ok {
			x.done <- nil
			delete(b.waiting, s)
		}
	}
}

// releaseOlder ends, with err, the barriers sent on a multicast socket
// older than generation gen: their replies will never be read. A full
// sync started after they were sent covers them (err nil).
func (b *barriers) releaseOlder(gen uint64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s, x := range b.waiting {
		if x.gen < gen {
			x.done <- err
			delete(b.waiting, s)
		}
	}
}
