//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/marksplit/marksplit/internal/pathmtu"
)

// snmp6Path holds the namespace's IPv6 counters, one "Name value" a line.
const snmp6Path = "/proc/net/snmp6"

// Learning from ICMP: the kernel records a PMTU exception for each "too
// big" message it accepts and announces none, so the learner reads the
// ICMP counters every learnPoll and dumps the exceptions when they rose,
// and every defaultResync in any case.
const learnPoll = 2 * time.Second

// learner turns the PMTU exceptions to the peers into learned path MTUs
// (--path-mtu-learn).
type learner struct {
	l        *loop
	dump     func() ([]pathmtu.Exception, error)
	del      func(pathmtu.Exception) error
	counters func() (uint64, error) // the sum of the ICMP "too big" counters
	last     uint64
	lastErr  string
}

func newLearner(l *loop) *learner {
	return &learner{l: l, dump: pathmtu.Exceptions, del: pathmtu.DeleteException, counters: icmpTooBig}
}

// run polls until ctx ends.
func (lr *learner) run(ctx context.Context) {
	poll := time.NewTicker(learnPoll)
	defer poll.Stop()
	resync := time.NewTicker(defaultResync)
	defer resync.Stop()
	lr.learn()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			n, err := lr.counters()
			if err != nil || n != lr.last {
				lr.last = n
				lr.learn()
			}
		case <-resync.C:
			lr.learn()
		}
	}
}

// learn reads the exceptions once: each on a route to an encrypting peer
// is a measurement of its path; an IPv6 one is deleted once it is in the
// store (the kernel deletes no single IPv4 one: those expire).
func (lr *learner) learn() {
	ps := lr.l.peers.Load()
	if ps == nil {
		return
	}
	es, err := lr.dump()
	if err != nil {
		if err.Error() != lr.lastErr {
			lr.l.log.Warn("path MTU: cannot read the PMTU exceptions (learning from ICMP needs kernel ≥ 5.3): " + err.Error())
		}
		lr.lastErr = err.Error()
		return
	}
	lr.lastErr = ""
	var cs []pathmtu.Change
	for _, e := range es {
		if !ps.has(e.Dst) {
			continue
		}
		if c, ok := lr.l.pmtu.Observe(e.Dst, e.MTU, pathmtu.SourceLearned); ok {
			cs = append(cs, c)
		}
		if err := lr.del(e); err != nil && !errors.Is(err, pathmtu.ErrNoDelete) {
			lr.l.log.Warn("path MTU: " + err.Error())
		}
	}
	lr.l.pathChanged(cs)
}

// icmpTooBig sums Icmp: InDestUnreachs (/proc/net/snmp) and
// Icmp6InPktTooBigs (/proc/net/snmp6): when it rises, a new exception may
// exist.
func icmpTooBig() (uint64, error) {
	b, err := os.ReadFile(snmpPath)
	if err != nil {
		return 0, err
	}
	icmp, err := parseSNMP(b, "Icmp")
	if err != nil {
		return 0, err
	}
	n := icmp["InDestUnreachs"]
	if b, err := os.ReadFile(snmp6Path); err == nil { // no IPv6: no file
		n += snmp6Value(b, "Icmp6InPktTooBigs")
	}
	return n, nil
}

// snmp6Value reads one counter of /proc/net/snmp6's format.
func snmp6Value(b []byte, name string) uint64 {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, _ := strconv.ParseUint(f[1], 10, 64)
			return v
		}
	}
	return 0
}
