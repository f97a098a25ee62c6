//go:build linux

package netwatchtest

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Fighter is one long-lived ip(8) in a namespace that runs one command
// again and again, as fast as the kernel answers (`yes CMD | ip -force
// -batch -`): another program fighting over an object, whose requests all
// come from one socket and one PID.
type Fighter struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	done chan struct{}
}

// StartFighter runs command (an ip(8) command line without "ip", such as
// "rule del pref 900") in ns until Stop or the end of the test.
func (ns *NetNS) StartFighter(t testing.TB, command string) *Fighter {
	t.Helper()
	cmd := exec.Command("nsenter", "--net="+ns.Path(), "ip", "-force", "-batch", "-")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &Fighter{cmd: cmd, in: in, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		w := bufio.NewWriter(in)
		for {
			if _, err := w.WriteString(command + "\n"); err != nil {
				return
			}
		}
	}()
	t.Cleanup(f.Stop)
	return f
}

// PID is the fighter's process ID, which its requests carry as their port.
func (f *Fighter) PID() int { return f.cmd.Process.Pid }

// Stop ends the fighter and waits for it. It is safe to call twice.
func (f *Fighter) Stop() {
	select {
	case <-f.done:
		return
	default:
	}
	f.in.Close()
	f.cmd.Process.Kill()
	<-f.done
	f.cmd.Wait()
}

// CheckFight has a Fighter run command (deleting an object a program made,
// such as "rule del pref 910") against the program whose log is logs for
// d, and longer until the program has warned (a busy machine gives both
// few turns), and checks what netwatch's Reconciler promises: the program repairs
// at a bounded rate (at most its burst of 20 and then ten a second, with
// room for the scheduler: repairLine appears no more often than that), it
// warns one to three times, naming the fighter as ip[PID], and once the
// fighter stops the object is back (restored reports it) within seconds.
func (ns *NetNS) CheckFight(t testing.TB, logs fmt.Stringer, command, repairLine string, d time.Duration, restored func() bool) {
	t.Helper()
	before := strings.Count(logs.String(), repairLine)
	warnsBefore := strings.Count(logs.String(), "fight: ")
	f := ns.StartFighter(t, command)
	start := time.Now()
	time.Sleep(d) // the least length of the fight, not a wait for a condition
	Poll(func() bool { return strings.Count(logs.String(), "fight: ") > warnsBefore })
	f.Stop()
	d = time.Since(start) // the fight's length, for the rate bound
	if !Poll(restored) {
		t.Fatalf("the object did not come back after the fight:\n%s", logs)
	}
	out := logs.String()
	repairs := strings.Count(out, repairLine) - before
	if limit := 20 + int(d.Seconds()*10*1.5) + 5; repairs > limit {
		t.Errorf("%d repairs in a fight of %v, more than %d: the program spins", repairs, d, limit)
	}
	if repairs == 0 {
		t.Errorf("no repairs during the fight: the fighter did nothing?")
	}
	want := fmt.Sprintf(" by ip[%d]; repairing at most every ", f.PID())
	warns := strings.Count(out, "fight: ") - warnsBefore
	if warns < 1 || warns > 3 || !strings.Contains(out, want) {
		t.Errorf("%d fight warnings, want 1 to 3 naming %q:\n%s", warns, want, out)
	}
}
