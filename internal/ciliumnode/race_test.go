//go:build race

package ciliumnode

// raceEnabled reports whether the race detector is on: it multiplies memory.
const raceEnabled = true
