package metricsserver

import (
	"github.com/marksplit/marksplit/internal/kubeauth"
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descAuthResults = prometheus.NewDesc("marksplit_metrics_auth_total",
		"Requests to the secure /metrics listener, by result: allowed, unauthenticated (401), denied (403: authenticated, not allowed get on /metrics), unavailable (503: the API server did not answer and no decision was cached), throttled (429: too many tokens to review).", []string{"result"}, nil)
	descAuthReviews = prometheus.NewDesc("marksplit_metrics_auth_api_requests_total",
		"TokenReviews and SubjectAccessReviews sent to the API server for the secure /metrics listener (decisions are cached: an allow 1 min, a denial 15 s).", nil, nil)
)

// AuthCollector reads an Authorizer's counters at scrape time.
type AuthCollector struct{ A *kubeauth.Authorizer }

// Describe implements prometheus.Collector.
func (c AuthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descAuthResults
	ch <- descAuthReviews
}

// Collect implements prometheus.Collector.
func (c AuthCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.A.Stats()
	for _, d := range kubeauth.Decisions() {
		ch <- prometheus.MustNewConstMetric(descAuthResults, prometheus.CounterValue, float64(st.Results[d]), d.String())
	}
	ch <- prometheus.MustNewConstMetric(descAuthReviews, prometheus.CounterValue, float64(st.APIRequests))
}
