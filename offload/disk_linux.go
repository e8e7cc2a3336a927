//go:build linux

package offload

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// allocateFile reserves n bytes of disk for f, so that writing through the
// mapping cannot hit a full disk (which would be SIGBUS).
func allocateFile(f *os.File, n int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, n)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		// tmpfs and some others: no reservation possible; size it instead.
		return f.Truncate(n)
	}
	return err
}

func (df *diskFile) mapFile() error {
	m, err := unix.Mmap(int(df.f.Fd()), 0, int(df.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	df.m = m
	return nil
}

func (df *diskFile) unmap() error {
	if df.m == nil {
		return nil
	}
	err := unix.Munmap(df.m)
	df.m = nil
	return err
}

func (df *diskFile) writeAll(src []byte) error { copy(df.m, src); return nil }
func (df *diskFile) readAll(dst []byte) error  { copy(dst, df.m); return nil }

// DiskFree is the space available to unprivileged users in the file
// system holding dir.
func DiskFree(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("offload: statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
