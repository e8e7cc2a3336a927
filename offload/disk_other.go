//go:build !linux

package offload

import (
	"errors"
	"os"
)

// allocateFile sizes f; elsewhere than Linux space is not reserved.
func allocateFile(f *os.File, n int64) error { return f.Truncate(n) }

// openDirect: no direct I/O elsewhere than Linux; requests use pread and
// pwrite through the page cache.
func openDirect(string) (*os.File, error) { return nil, errors.New("offload: no direct I/O") }

// DiskFree is not implemented elsewhere than Linux.
func DiskFree(dir string) (int64, error) {
	return 0, errors.New("offload: free disk space is only known on Linux")
}
