// Package kubeauth decides whether the bearer token of an HTTP request may read a
// non-resource URL of the agent (its /metrics), by asking the Kubernetes API server
// as kube-rbac-proxy does: a TokenReview (authentication.k8s.io/v1) says who the
// token is, a SubjectAccessReview (authorization.k8s.io/v1) says whether that user
// may "get" the path.
//
// # Cost
//
// Decisions are cached by a SHA-256 of the token (the token itself is kept only for
// the duration of its review): an allow for AllowTTL, a denial for DenyTTL, at most
// MaxEntries of them (the least recently used goes first). A token that is not an
// RFC 6750 bearer token, or is longer than MaxTokenBytes, is refused without asking
// the API. Reviews are rate-limited (ReviewsPerSecond, ReviewBurst), at most
// MaxInflight at a time, and one per token however many requests carry it; a
// request that finds the budget spent is answered 429 without an API call. So a
// flood of distinct tokens costs a bounded cache and a bounded rate of API calls.
// A token whose allow has just expired is reviewed again outside the budget, so
// that such a flood does not lock out a scraper that was allowed. A client (an
// IPv4 address, an IPv6 /64) that sent a token the API server did not
// authenticate reviews its next ones for SuspectTTL on a second budget of
// ReviewsPerSecond, apart from the others': a flood of made-up tokens spends
// its own budget, and a new valid token from another client (after a token
// rotation or a Prometheus restart) is reviewed at once. To spend the others'
// budget a flood needs a new client for each of its first tokens. At most
// MaxEntries clients are remembered.
//
// # Failure
//
// When the API server does not answer and no decision is cached the request gets
// 503: scrapes fail, nothing else does. Errors are not cached.
//
// # Concurrency
//
// An Authorizer is safe for concurrent use; Handler's requests run in parallel.
package kubeauth
