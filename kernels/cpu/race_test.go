//go:build race

package cpu

// raceEnabled: the race detector adds allocations of its own, so tests
// that count allocations skip under it.
const raceEnabled = true
