package neighbours

import "testing"

func TestNeighbours(t *testing.T) {
	for _, tt := range []struct {
		got, want string
	}{
		{Table(2004), "Cilium's table 2004"},
		{Table(200), "Cilium's table 200"},
		{Table(52), "Tailscale's table 52"},
		{Table(203), ""},
		{Table(900), ""},
		{Priority(1), "Cilium's rule priority 1"},
		{Priority(111), "Cilium's rule priority 111"},
		{Priority(5210), "Tailscale's rule priority 5210"},
		{Priority(5271), ""},
		{Priority(900), ""},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
