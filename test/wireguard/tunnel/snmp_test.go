package tunnel

import "testing"

func TestParseFrag(t *testing.T) {
	snmp := "Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits\n" +
		"Ip: 2 64 1000 0 0 0 0 0 900 800 0 0 0 0 0 0 30398 7 60796 900\n" +
		"Icmp: InMsgs InErrors\nIcmp: 0 0\n"
	got, err := parseFrag(snmp)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Frag{OKs: 30398, Creates: 60796, Fails: 7}); got != want {
		t.Errorf("parseFrag = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "Ip: FragOKs\n", "Ip: FragOKs FragCreates FragFails\nIp: 1 x 3\n", "Ip: Forwarding\nIp: 1\n"} {
		if f, err := parseFrag(bad); err == nil {
			t.Errorf("parseFrag(%q) = %+v, want an error", bad, f)
		}
	}
}

func TestRequiredVersion(t *testing.T) {
	gomod := []byte("module x\n\ntool golang.zx2c4.com/wireguard\n\nrequire (\n\tgolang.zx2c4.com/wireguard v0.0.0-20260522210424-ecfc5a8d5446 // indirect\n)\n")
	if got, want := requiredVersion(gomod, wireguardModule), "v0.0.0-20260522210424-ecfc5a8d5446"; got != want {
		t.Errorf("requiredVersion = %q, want %q", got, want)
	}
	if got := requiredVersion([]byte("module x\n"), wireguardModule); got != "" {
		t.Errorf("requiredVersion without a require line = %q, want \"\"", got)
	}
}
