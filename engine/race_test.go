//go:build race

package engine

// raceEnabled: the race detector allocates on its own account, so tests
// that count Go allocations skip under it.
const raceEnabled = true
