//go:build linux

package offload

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/spill-ml/spill/kernels"
)

// MmapPinner maps anonymous memory off the Go heap (kernels.MapHost) and,
// if Lock is set, locks it into RAM (mlock), which counts against
// RLIMIT_MEMLOCK. With Prefault it asks for transparent huge pages and
// faults every page in on all cores before Pin returns.
type MmapPinner struct{ Lock, Prefault bool }

type mmapMem struct{ b []byte }

func (m *mmapMem) Bytes() []byte { return m.b }

func (m *mmapMem) Free() error {
	if m.b == nil {
		return fmt.Errorf("offload: host memory freed twice")
	}
	err := kernels.UnmapHost(m.b)
	m.b = nil
	return err
}

// Pin maps n bytes.
func (p MmapPinner) Pin(n int64) (HostMemory, error) {
	b, err := kernels.MapHost(int(n), p.Prefault)
	if err != nil {
		return nil, err
	}
	if p.Lock {
		if err := unix.Mlock(b); err != nil {
			_ = kernels.UnmapHost(b)
			return nil, fmt.Errorf("mlock %d bytes: %w (see `ulimit -l`)", n, err)
		}
	}
	return &mmapMem{b: b}, nil
}

// CountsAgainstMemlock is p.Lock.
func (p MmapPinner) CountsAgainstMemlock() bool { return p.Lock }

// ReadLimits reads RLIMIT_MEMLOCK and MemAvailable from /proc/meminfo.
func ReadLimits() (Limits, error) {
	lim := Limits{Memlock: -1, MemAvailable: -1}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return lim, fmt.Errorf("getrlimit(RLIMIT_MEMLOCK): %w", err)
	}
	if rl.Cur != unix.RLIM_INFINITY {
		lim.Memlock = int64(rl.Cur)
	}
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return lim, err
	}
	avail, err := parseMemAvailable(data)
	if err != nil {
		return lim, err
	}
	lim.MemAvailable = avail
	return lim, nil
}

// ReadRSS is the process's resident set size in bytes (VmRSS), 0 if
// unknown.
func ReadRSS() int64 { return readStatusKB("VmRSS:") }

// ReadPeakRSS is the process's peak resident set size in bytes (VmHWM),
// 0 if unknown.
func ReadPeakRSS() int64 { return readStatusKB("VmHWM:") }

func readStatusKB(key string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return n << 10
				}
			}
		}
	}
	return 0
}
