package kubeauth

import (
	"net/http"
	"net/netip"
	"strings"
)

// Handler serves next to requests whose bearer token is Allowed, and answers the
// others with the Decision's status code. It reads no request body.
func (a *Authorizer) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, err := a.CheckFrom(r.Context(), clientKey(r.RemoteAddr), bearerToken(r))
		a.counters[d].Add(1)
		if d == Allowed {
			next.ServeHTTP(w, r)
			return
		}
		msg := ""
		switch d {
		case Unauthenticated:
			w.Header().Set("WWW-Authenticate", `Bearer realm="marksplit"`)
			msg = "Unauthorized: a bearer token the Kubernetes API server authenticates is required"
		case Denied:
			msg = "Forbidden: the token's user may not get " + a.cfg.Path + " (bind it to a ClusterRole with nonResourceURLs [\"" + a.cfg.Path + "\"], verbs [\"get\"])"
		case Throttled:
			w.Header().Set("Retry-After", "1")
			msg = "Too many tokens to review: try again"
		default:
			msg = "Service Unavailable: the Kubernetes API server could not review the token"
			a.log.Debug("metrics auth: no decision", "err", err)
		}
		http.Error(w, msg, d.StatusCode())
	})
}

// bearerToken returns the token of an "Authorization: Bearer" header, or "".
func bearerToken(r *http.Request) string {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// clientKey names the client of a request by its address: an IPv4 address, or
// an IPv6 /64 (one host's share of a network); "" when there is none.
func clientKey(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return ""
	}
	ip := ap.Addr().Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.Prefix(64)
	return p.String()
}
