package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// snmpPath holds the network namespace's IP counters. /proc/net is
// /proc/self/net: the namespace of the agent's own process.
const snmpPath = "/proc/net/snmp"

// fragCounters are the host's IPv4 fragmentation counters.
type fragCounters struct {
	OKs     uint64 // Ip: FragOKs, datagrams fragmented
	Creates uint64 // Ip: FragCreates, fragments created
}

func readFragCounters(path string) (fragCounters, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return fragCounters{}, err
	}
	ip, err := parseSNMP(b, "Ip")
	if err != nil {
		return fragCounters{}, fmt.Errorf("%s: %w", path, err)
	}
	var c fragCounters
	var ok1, ok2 bool
	c.OKs, ok1 = ip["FragOKs"]
	c.Creates, ok2 = ip["FragCreates"]
	if !ok1 || !ok2 {
		return fragCounters{}, fmt.Errorf("%s: no Ip: FragOKs and FragCreates", path)
	}
	return c, nil
}

// parseSNMP reads the counters of one protocol from /proc/net/snmp's
// format: for each protocol a line of names and a line of values, both
// starting with "Proto:".
func parseSNMP(b []byte, proto string) (map[string]uint64, error) {
	prefix := proto + ":"
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != prefix {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		if len(f)-1 != len(names) {
			return nil, fmt.Errorf("%s %d names but %d values", prefix, len(names), len(f)-1)
		}
		m := make(map[string]uint64, len(names))
		for i, n := range names {
			// Some counters (Ip: Forwarding, DefaultTTL; Tcp: MaxConn) are
			// gauges that can be negative; they are skipped.
			if v, err := strconv.ParseUint(f[i+1], 10, 64); err == nil {
				m[n] = v
			}
		}
		return m, nil
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("no %s lines", prefix)
}
