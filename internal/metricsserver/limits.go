package metricsserver

import "time"

// Limits bound what a server holds for its clients, so that no one can grow
// the agent's memory or keep others out by opening connections: at most
// MaxConns at a time (a new one sheds an idle one), each closed when it idles,
// dawdles over its request or its answer.
type Limits struct {
	MaxConns       int
	ReadHeader     time.Duration
	Read           time.Duration
	Write          time.Duration
	Idle           time.Duration
	MaxHeaderBytes int
}

// DefaultLimits are the agent's: a Prometheus server and the kubelet's probes
// need a few connections and a fraction of a second each; 64 connections at
// ~20 KiB each are ~1.3 MiB at most.
func DefaultLimits() Limits {
	return Limits{
		MaxConns:       64,
		ReadHeader:     5 * time.Second,
		Read:           10 * time.Second,
		Write:          10 * time.Second,
		Idle:           10 * time.Second,
		MaxHeaderBytes: 8 << 10,
	}
}
