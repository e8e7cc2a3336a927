//go:build !linux

package offload

import (
	"errors"
	"os"
)

// allocateFile sizes f; elsewhere than Linux space is not reserved.
func allocateFile(f *os.File, n int64) error { return f.Truncate(n) }

// Files are not mapped elsewhere than Linux: reads and writes use pread
// and pwrite.
func (df *diskFile) mapFile() error { return nil }
func (df *diskFile) unmap() error   { return nil }

func (df *diskFile) writeAll(src []byte) error { _, err := df.f.WriteAt(src, 0); return err }
func (df *diskFile) readAll(dst []byte) error  { _, err := df.f.ReadAt(dst, 0); return err }

// DiskFree is not implemented elsewhere than Linux.
func DiskFree(dir string) (int64, error) {
	return 0, errors.New("offload: free disk space is only known on Linux")
}
