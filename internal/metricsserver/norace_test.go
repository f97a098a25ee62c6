//go:build !race

package metricsserver

// raceEnabled reports whether the race detector is on: it multiplies memory.
const raceEnabled = false
