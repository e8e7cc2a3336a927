//go:build !linux

package dataset

// adviseWillNeed is a no-op where madvise is not available.
func adviseWillNeed(m []byte, from, to int64) {}
