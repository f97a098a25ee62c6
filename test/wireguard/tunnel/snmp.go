package tunnel

import (
	"fmt"
	"strconv"
	"strings"
)

// Frag is the IPv4 fragmentation counters of one network namespace, as
// the `Ip:` lines of /proc/net/snmp have them.
type Frag struct {
	OKs     uint64 // FragOKs: packets fragmented
	Creates uint64 // FragCreates: fragments made
	Fails   uint64 // FragFails: packets that needed fragmenting and had DF
}

// Sub returns f − g, counter by counter.
func (f Frag) Sub(g Frag) Frag {
	return Frag{OKs: f.OKs - g.OKs, Creates: f.Creates - g.Creates, Fails: f.Fails - g.Fails}
}

func (f Frag) String() string {
	return fmt.Sprintf("FragOKs %d, FragCreates %d", f.OKs, f.Creates)
}

// parseFrag reads the counters from the text of /proc/net/snmp: a header
// line "Ip: Forwarding … FragOKs …" followed by a line of values.
func parseFrag(snmp string) (Frag, error) {
	var names []string
	for line := range strings.SplitSeq(snmp, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Ip:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		if len(f) != len(names) {
			return Frag{}, fmt.Errorf("tunnel: snmp: %d Ip: names, %d values", len(names), len(f))
		}
		var fr Frag
		found := 0
		for i, n := range names {
			p := map[string]*uint64{"FragOKs": &fr.OKs, "FragCreates": &fr.Creates, "FragFails": &fr.Fails}[n]
			if p == nil {
				continue
			}
			v, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				return Frag{}, fmt.Errorf("tunnel: snmp: %s: %w", n, err)
			}
			*p = v
			found++
		}
		if found != 3 {
			return Frag{}, fmt.Errorf("tunnel: snmp: FragOKs, FragCreates or FragFails missing")
		}
		return fr, nil
	}
	return Frag{}, fmt.Errorf("tunnel: snmp: no Ip: lines")
}
