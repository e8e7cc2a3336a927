//go:build !linux

package offload

// MmapPinner falls back to ordinary Go memory on systems other than Linux:
// it is not page-locked, so copies from it are synchronous on CUDA.
type MmapPinner struct{ Lock, Prefault bool }

type heapMem struct{ b []byte }

func (m *heapMem) Bytes() []byte { return m.b }
func (m *heapMem) Free() error   { m.b = nil; return nil }

// Pin allocates n bytes.
func (p MmapPinner) Pin(n int64) (HostMemory, error) { return &heapMem{b: make([]byte, n)}, nil }

// CountsAgainstMemlock is false: nothing is locked.
func (p MmapPinner) CountsAgainstMemlock() bool { return false }

// ReadLimits reports both limits as unknown.
func ReadLimits() (Limits, error) { return Limits{Memlock: -1, MemAvailable: -1}, nil }

// ReadRSS is 0: unknown on this system.
func ReadRSS() int64 { return 0 }

// ReadPeakRSS is 0: unknown on this system.
func ReadPeakRSS() int64 { return 0 }
