//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/marksplit/marksplit/internal/textsafe"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/program"
)

// errVerify is the error of a verify whose answers show no split.
var errVerify = errors.New("the split is not in place")

// verifyReport is what verify found, printed as lines or, with --json, as
// one JSON object (docs/design.md, "verify --json"): fields are added,
// never changed.
type verifyReport struct {
	Peer      string `json:"peer"`
	Unmarked  string `json:"unmarked"`   // the unmarked answer, as the text line says it
	Marked    string `json:"marked"`     // the answer with the mark
	Mark      string `json:"mark"`       // the mark asked with
	Table     uint32 `json:"table"`      // the table of the unmarked answer
	MTU       uint32 `json:"mtu"`        // its MTU (the link's when the route has none)
	TunnelMTU uint32 `json:"tunnel_mtu"` // the tunnel link's MTU; 0 when it does not exist
	WantMTU   uint32 `json:"want_mtu"`   // the MTU the unmarked answer must have: the tunnel's, or the peer's inner MTU
	NotPeer   bool   `json:"not_peer"`   // with --peers=auto: no encrypting peer's address (it must not be split)
	// PathMTU is the peer's path MTU with --peers=auto: the running
	// agent's, else what the flags declare.
	PathMTU  *pathReport `json:"path_mtu,omitempty"`
	OK       bool        `json:"ok"`
	Problems []string    `json:"problems,omitempty"`
}

// runVerify is `marksplit verify`: RTM_GETROUTE for the peer without and
// with the mark, judged against the table and the tunnel link's MTU (the
// peer's inner MTU where its path MTU lowers its route).
func runVerify(o options, s *program.Session, l *loop) error {
	ap, stdout := s.Applier, s.Stdout
	unmarked, err := ap.RouteGet(o.peer, 0)
	if err != nil {
		return err
	}
	marked, err := ap.RouteGet(o.peer, o.policy.Mark)
	if err != nil {
		return err
	}
	var (
		tun    netwatch.Link
		hasTun bool
		lines  [2]string
		mtus   [2]uint32
	)
	s.Watcher.Read(func(v netwatch.View) {
		tun, hasTun = v.LinkByName(o.policy.TunnelLink)
		for i, rt := range []netwatch.Route{unmarked, marked} {
			mtus[i] = rt.MTU
			src := ""
			if rt.MTU == 0 {
				if l, ok := v.Link(rt.Index); ok {
					mtus[i], src = l.MTU, " (the link's)"
				}
			}
			_, hop, _ := strings.Cut(getRouteWords(rt).Describe(v.Link), " ") // after the destination
			lines[i] = fmt.Sprintf("%v %s table %v mtu %d%s", o.peer, hop, rt.Table, mtus[i], src)
		}
	})
	rep := verifyReport{Peer: o.peer.String(), Unmarked: lines[0], Marked: lines[1], Mark: o.policy.Mark.String(),
		Table: uint32(unmarked.Table), MTU: mtus[0]}
	if hasTun {
		rep.TunnelMTU, rep.WantMTU = tun.MTU, tun.MTU
	}
	if ps := l.peers.Load(); o.policy.Peers && ps != nil {
		if rep.NotPeer = !ps.has(o.peer); !rep.NotPeer && hasTun {
			rep.PathMTU = verifyPathMTU(o, l, int(tun.MTU))
			if pm := rep.PathMTU; pm.State == "reduced" && pm.Inner > 0 && uint32(pm.Inner) < rep.WantMTU {
				rep.WantMTU = uint32(pm.Inner)
			}
		}
	}
	if !o.verifyJSON {
		fmt.Fprintf(stdout, "unmarked:  %s\n", textsafe.Terminal(lines[0]))
		fmt.Fprintf(stdout, "mark %v: %s\n", o.policy.Mark, textsafe.Terminal(lines[1]))
		if rep.PathMTU != nil {
			fmt.Fprintf(stdout, "path MTU:  %s\n", textsafe.Terminal(rep.PathMTU.text()))
		}
	}
	if rep.NotPeer {
		if unmarked.Table == o.policy.Table {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%v is no encrypting peer's address, yet unmarked traffic to it uses table %v", o.peer, o.policy.Table))
		}
		return rep.finish(o, stdout, func() {
			fmt.Fprintf(stdout, "ok: %v is no encrypting peer's address (an opted-out node's, this node's, or no node's): unmarked traffic to it does not use table %v\n",
				o.peer, o.policy.Table)
		})
	}
	switch {
	case !hasTun:
		rep.Problems = append(rep.Problems, fmt.Sprintf("tunnel link %s does not exist", o.policy.TunnelLink))
	default:
		if unmarked.Table != o.policy.Table {
			rep.Problems = append(rep.Problems, fmt.Sprintf("unmarked traffic uses table %v, not %v", unmarked.Table, o.policy.Table))
		}
		switch {
		case mtus[0] == rep.WantMTU:
		case rep.WantMTU != tun.MTU:
			rep.Problems = append(rep.Problems, fmt.Sprintf("unmarked traffic has MTU %d, not the peer's inner MTU %d (its path MTU; %s's is %d)", mtus[0], rep.WantMTU, tun.Name, tun.MTU))
		default:
			rep.Problems = append(rep.Problems, fmt.Sprintf("unmarked traffic has MTU %d, not %s's %d", mtus[0], tun.Name, tun.MTU))
		}
	}
	if marked.Table == o.policy.Table {
		rep.Problems = append(rep.Problems, fmt.Sprintf("marked traffic uses table %v too", marked.Table))
	}
	return rep.finish(o, stdout, func() {
		if rep.WantMTU != tun.MTU {
			fmt.Fprintf(stdout, "ok: unmarked traffic to %v uses table %v at the peer's inner MTU %d (its path MTU, below %s's %d); marked traffic does not use table %v (MTU %d)\n",
				o.peer, o.policy.Table, rep.WantMTU, textsafe.Terminal(tun.Name), tun.MTU, o.policy.Table, mtus[1])
			return
		}
		fmt.Fprintf(stdout, "ok: unmarked traffic to %v uses table %v at %s's MTU %d; marked traffic does not use table %v (MTU %d)\n",
			o.peer, o.policy.Table, textsafe.Terminal(tun.Name), tun.MTU, o.policy.Table, mtus[1])
	})
}

// finish prints the verdict (ok, the ok line; else FAIL and the
// problems), or the whole report as JSON with --json, and returns
// errVerify when there are problems.
func (rep *verifyReport) finish(o options, stdout io.Writer, ok func()) error {
	rep.OK = len(rep.Problems) == 0
	switch {
	case o.verifyJSON:
		b, err := json.Marshal(rep)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", b)
	case rep.OK:
		ok()
	default:
		fmt.Fprintf(stdout, "FAIL: %s\n", textsafe.Terminal(strings.Join(rep.Problems, "; ")))
	}
	if !rep.OK {
		return errVerify
	}
	return nil
}

// verifyPathMTU is the peer's path MTU: the running agent's answer on its
// health socket (only it knows what it learned and probed), else the value
// the flags declare, saying why.
func verifyPathMTU(o options, l *loop, tunnel int) *pathReport {
	why := "no --health-socket to ask the running agent"
	if o.healthSocket != "" {
		answer, err := askHealth(o.healthSocket, healthPathMTU+" "+o.peer.String(), healthTimeout)
		var r pathReport
		switch {
		case err != nil:
			why = "the running agent did not answer: " + err.Error()
		case !strings.HasPrefix(answer, "{"):
			why = "the running agent did not tell: " + answer
		default:
			if err := json.Unmarshal([]byte(answer), &r); err != nil {
				why = "the running agent's answer is not one: " + err.Error()
				break
			}
			r.From = "agent"
			return &r
		}
	}
	l.pmtu.SetTunnelMTU(tunnel)
	r := newPathReport(l.pmtu.Peer(o.peer), time.Now())
	r.From, r.Why = "flags", why
	return &r
}

// getRouteWords shapes a route-get answer for Route.Describe: the peer
// replaces the destination and its type, table and MTU are printed apart,
// and the answer's scope, metric and protocol say nothing here.
func getRouteWords(r netwatch.Route) netwatch.Route {
	r.MTU, r.Metric, r.Scope, r.Type = 0, 0, netwatch.ScopeUniverse, netwatch.RouteUnicast
	r.Table, r.Protocol = netwatch.TableMain, netwatch.ProtoBoot // neither printed
	return r
}
