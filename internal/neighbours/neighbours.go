// Package neighbours names the routing tables and rule priorities that
// known programs on a Kubernetes node keep for themselves (Cilium's and
// Tailscale's), so that the agent refuses to own one of them unless told to
// share it. It is the agent's knowledge, not the library's: netwatch and
// reconcile refuse only what the kernel reserves.
package neighbours

import "fmt"

// Table names the known program whose tables include t ("Cilium's table
// 2004"), or returns "". Owning it would remove that program's routes.
func Table(t uint32) string {
	switch {
	case t >= 200 && t <= 202 || t == 2004 || t == 2005:
		return fmt.Sprintf("Cilium's table %d", t)
	case t == 52:
		return "Tailscale's table 52"
	}
	return ""
}

// Priority names the known program whose rules are at p ("Cilium's rule
// priority 100"), or returns "", as Table does.
func Priority(p uint32) string {
	switch {
	case p == 1 || p >= 8 && p <= 10 || p == 20 || p == 100 || p >= 109 && p <= 112:
		return fmt.Sprintf("Cilium's rule priority %d", p)
	case p >= 5210 && p <= 5270:
		return fmt.Sprintf("Tailscale's rule priority %d", p)
	}
	return ""
}
