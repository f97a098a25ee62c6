//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The rule both repairers keep: not fwmark 0xe00/0xf00 lookup 900 pref 900.
const (
	rulePriority = 900
	ruleTable    = 900
	ruleMark     = 0xe00
	ruleMask     = 0xf00
)

// pollLoop is the old approach, verbatim but for the interval.
func pollLoop(interval time.Duration) string {
	return fmt.Sprintf("while true; do ip rule show pref %d | grep -q . || ip rule add not fwmark 0x%x/0x%x lookup %d pref %d; sleep %g; done",
		rulePriority, ruleMark, ruleMask, ruleTable, rulePriority, interval.Seconds())
}

// ruleEvent is an IPv4 rule notification at the priority, stamped as it
// arrived.
type ruleEvent struct {
	typ uint16
	at  time.Time
}

// ruleListener reads the namespace's IPv4 rule notifications on a socket
// of its own.
type ruleListener struct {
	s    *nlSock
	ch   chan ruleEvent
	done chan struct{}
}

func listenRules(ns *netNS) (*ruleListener, error) {
	s, err := ns.dialNL(unix.RTNLGRP_IPV4_RULE)
	if err != nil {
		return nil, err
	}
	if err := s.setRecvTimeout(50 * time.Millisecond); err != nil {
		s.Close()
		return nil, err
	}
	l := &ruleListener{s: s, ch: make(chan ruleEvent, 64), done: make(chan struct{})}
	go l.run()
	return l, nil
}

func (l *ruleListener) run() {
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-l.done:
			return
		default:
		}
		n, err := unix.Read(l.s.fd, buf)
		if err != nil {
			continue // EAGAIN: look at done; ENOBUFS cannot happen at this rate
		}
		now := time.Now()
		for m := buf[:n]; len(m) >= unix.NLMSG_HDRLEN; {
			ml := int(binary.NativeEndian.Uint32(m))
			if ml < unix.NLMSG_HDRLEN || ml > len(m) {
				break
			}
			typ := binary.NativeEndian.Uint16(m[4:])
			if (typ == unix.RTM_NEWRULE || typ == unix.RTM_DELRULE) && rulePriorityOf(m[unix.NLMSG_HDRLEN:ml]) == rulePriority {
				select {
				case l.ch <- ruleEvent{typ, now}:
				default:
				}
			}
			m = m[align4(ml):]
		}
	}
}

// rulePriorityOf reads FRA_PRIORITY from a fib_rule_hdr and its attributes.
func rulePriorityOf(data []byte) uint32 {
	if len(data) < 12 {
		return 0
	}
	for a := data[12:]; len(a) >= 4; {
		l := int(binary.NativeEndian.Uint16(a))
		if l < 4 || l > len(a) {
			return 0
		}
		if binary.NativeEndian.Uint16(a[2:]) == unix.FRA_PRIORITY && l == 8 {
			return binary.NativeEndian.Uint32(a[4:])
		}
		a = a[min(align4(l), len(a)):]
	}
	return 0
}

func (l *ruleListener) Close() {
	close(l.done)
	l.s.Close()
}

func (l *ruleListener) drain() {
	for len(l.ch) > 0 {
		<-l.ch
	}
}

// wait returns the next event of type typ, or an error after d.
func (l *ruleListener) wait(typ uint16, d time.Duration) (time.Time, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case ev := <-l.ch:
			if ev.typ == typ {
				return ev.at, nil
			}
		case <-t.C:
			return time.Time{}, fmt.Errorf("no rule %d event of type %d within %v", rulePriority, typ, d)
		}
	}
}

// deleteRule removes the rule as `ip rule del not fwmark 0xe00/0xf00
// lookup 900 pref 900` would: a foreign deletion, by its full key.
func deleteRule(s *nlSock) error {
	seq := s.nextSeq()
	b, start := beginMsg(nil, unix.RTM_DELRULE, unix.NLM_F_REQUEST|unix.NLM_F_ACK, seq)
	// struct fib_rule_hdr: family, dst_len, src_len, tos, table, res1,
	// res2, action, flags.
	b = append(b, unix.AF_INET, 0, 0, 0, 0, 0, 0, unix.FR_ACT_TO_TBL)
	b = binary.NativeEndian.AppendUint32(b, unix.FIB_RULE_INVERT)
	b = nlAttr(b, unix.FRA_PRIORITY, u32(rulePriority))
	b = nlAttr(b, unix.FRA_TABLE, u32(ruleTable))
	b = nlAttr(b, unix.FRA_FWMARK, u32(ruleMark))
	b = nlAttr(b, unix.FRA_FWMASK, u32(ruleMask))
	b = endMsg(b, start)
	if _, err := unix.Write(s.fd, b); err != nil {
		return err
	}
	return s.waitAck(seq)
}

// restoreOnce deletes the rule at when (or at once if zero) and returns
// the time from the kernel's notification of the deletion to that of the
// restored rule.
func restoreOnce(l *ruleListener, s *nlSock, when time.Time, timeout time.Duration) (time.Duration, time.Time, error) {
	if d := time.Until(when); d > 0 {
		t := time.NewTimer(d)
		<-t.C
	}
	l.drain()
	if err := deleteRule(s); err != nil {
		return 0, time.Time{}, fmt.Errorf("delete rule: %w", err)
	}
	del, add, err := l.waitRestore(timeout)
	if err != nil {
		return 0, time.Time{}, err
	}
	return absDuration(add.Sub(del)), add, nil
}

// waitRestore returns the times of the rule's deletion and of its
// restoration. The kernel announces a rule change after releasing the
// RTNL lock, so a repairer that acts while the deletion is still being
// announced can have its addition reach this listener first: then the
// repair took less than the gap between the two.
func (l *ruleListener) waitRestore(timeout time.Duration) (del, add time.Time, err error) {
	t := time.NewTimer(5*time.Second + timeout)
	defer t.Stop()
	for del.IsZero() || add.IsZero() {
		select {
		case ev := <-l.ch:
			switch {
			case ev.typ == unix.RTM_DELRULE && del.IsZero():
				del = ev.at
			case ev.typ == unix.RTM_NEWRULE && add.IsZero():
				add = ev.at
			}
		case <-t.C:
			if del.IsZero() {
				return del, add, fmt.Errorf("no rule %d deletion event within %v", rulePriority, 5*time.Second+timeout)
			}
			return del, add, fmt.Errorf("not restored: no rule %d event of type %d within %v", rulePriority, unix.RTM_NEWRULE, timeout)
		}
	}
	return del, add, nil
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// proc is a repairer running in the namespace, in its own process group.
type proc struct {
	cmd  *exec.Cmd
	out  bytes.Buffer // its output, to read after stop
	done chan struct{}
}

func startProc(cmd *exec.Cmd) (*proc, error) {
	p := &proc{cmd: cmd, done: make(chan struct{})}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { cmd.Wait(); close(p.done) }()
	return p, nil
}

// stop sends SIGTERM to the process group it started (the agent, or the
// shell and its sleep), then SIGKILL after 5 s.
func (p *proc) stop() {
	pgid := p.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
}

// repairAgent measures the built agent: a deletion every repairPace, as a
// foreign program's occasional deletion comes (back-to-back deletions are
// a fight, whose pace the agent limits on purpose), and a fresh agent
// every five, so that the trials include agents' first repairs.
// repairPace is the time between the agent's trials: longer than its
// coalescing window (10 ms) and its repair rate limit's refill (100 ms).
const repairPace = 150 * time.Millisecond

func repairAgent(agent string, trials int, logf func(string, ...any)) (repairResult, error) {
	res := repairResult{Name: "marksplit agent"}
	t, err := newTopo()
	if err != nil {
		return res, err
	}
	defer t.Close()
	l, err := listenRules(t.node)
	if err != nil {
		return res, err
	}
	defer l.Close()
	s, err := t.node.dialNL()
	if err != nil {
		return res, err
	}
	defer s.Close()
	const perAgent = 5
	for len(res.Latencies) < trials {
		p, err := startProc(t.node.command(context.Background(), agent, "run", "--encryption=on", "--prefix=10.0.0.0/16", "--metrics-addr="))
		if err != nil {
			return res, err
		}
		_, err = l.wait(unix.RTM_NEWRULE, 30*time.Second)
		for i := 0; err == nil && i < perAgent && len(res.Latencies) < trials; i++ {
			var d time.Duration
			if d, _, err = restoreOnce(l, s, time.Now().Add(repairPace), 10*time.Second); err == nil {
				res.Latencies = append(res.Latencies, d)
				logf("  agent trial %d: %v", len(res.Latencies), d)
			}
		}
		p.stop()
		if err != nil {
			return res, fmt.Errorf("agent: %w; its output:\n%s", err, p.out.String())
		}
		// A stopped agent leaves its rule in place: take it away, so that
		// the next agent's adding it says that agent is up.
		l.drain()
		if err := deleteRule(s); err != nil {
			return res, fmt.Errorf("delete rule between agents: %w", err)
		}
		if _, err := l.wait(unix.RTM_DELRULE, 5*time.Second); err != nil {
			return res, err
		}
	}
	return res, nil
}

// repairPoll measures the shell loop. Each deletion comes at a random
// moment of the loop's cycle, stratified so that the trials cover the
// cycle evenly: trial i of n deletes at a uniform offset within
// [i/n, (i+1)/n) of the interval after the last restoration, in a
// shuffled order.
func repairPoll(trials int, interval time.Duration, logf func(string, ...any)) (repairResult, error) {
	res := repairResult{Name: fmt.Sprintf("shell loop polling every %v", interval), Interval: interval}
	t, err := newTopo()
	if err != nil {
		return res, err
	}
	defer t.Close()
	l, err := listenRules(t.node)
	if err != nil {
		return res, err
	}
	defer l.Close()
	s, err := t.node.dialNL()
	if err != nil {
		return res, err
	}
	defer s.Close()
	p, err := startProc(t.node.command(context.Background(), "sh", "-c", pollLoop(interval)))
	if err != nil {
		return res, err
	}
	defer p.stop()
	last, err := l.wait(unix.RTM_NEWRULE, 10*time.Second)
	if err != nil {
		p.stop()
		return res, fmt.Errorf("poll loop: %w; its output:\n%s", err, p.out.String())
	}
	order := rand.Perm(trials)
	for _, k := range order {
		frac := (float64(k) + rand.Float64()) / float64(trials)
		when := last.Add(time.Duration(frac * float64(interval)))
		d, at, err := restoreOnce(l, s, when, interval+10*time.Second)
		if err != nil {
			return res, fmt.Errorf("poll loop: %w", err)
		}
		res.Latencies = append(res.Latencies, d)
		logf("  poll-loop trial %d (deleted %.0f%% into the cycle): %v", len(res.Latencies), 100*frac, d)
		last = at
	}
	return res, nil
}
