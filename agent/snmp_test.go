package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const snmpSample = `Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits
Ip: 1 64 2563 0 0 0 0 0 2563 2611 0 12 0 0 0 0 417 0 1251 2611
Icmp: InMsgs InErrors InCsumErrors InDestUnreachs
Icmp: 3 0 0 3
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens
Tcp: 1 200 120000 -1 57
`

func TestReadFragCounters(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "snmp")
	if err := os.WriteFile(good, []byte(snmpSample), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readFragCounters(good)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(fragCounters{OKs: 417, Creates: 1251}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	tcp, err := parseSNMP([]byte(snmpSample), "Tcp")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]uint64{"RtoAlgorithm": 1, "RtoMin": 200, "RtoMax": 120000, "ActiveOpens": 57}, tcp); diff != "" {
		t.Errorf("Tcp (-want +got):\n%s", diff)
	}

	for name, body := range map[string]string{
		"no Ip lines":     "Icmp: InMsgs\nIcmp: 3\n",
		"names only":      "Ip: FragOKs FragCreates\n",
		"short values":    "Ip: FragOKs FragCreates\nIp: 1\n",
		"no frag columns": "Ip: Forwarding\nIp: 1\n",
	} {
		p := filepath.Join(dir, "bad")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if c, err := readFragCounters(p); err == nil {
			t.Errorf("%s: got %+v, want an error", name, c)
		}
	}
	if _, err := readFragCounters(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file: no error")
	}
}

// The real file parses, wherever the tests run.
func TestReadFragCountersProc(t *testing.T) {
	if _, err := os.Stat(snmpPath); err != nil {
		t.Skipf("no %s: %v", snmpPath, err)
	}
	if _, err := readFragCounters(snmpPath); err != nil {
		t.Fatal(err)
	}
}
