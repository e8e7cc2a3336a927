//go:build !linux

package engine

// dontNeed is a no-op where madvise is not used.
func dontNeed([]byte) {}
