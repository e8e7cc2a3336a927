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

// openDirect opens path for direct I/O (O_DIRECT), bypassing the page
// cache; it fails where the file system does not support it.
func openDirect(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
}

// DiskFree is the space available to unprivileged users in the file
// system holding dir.
func DiskFree(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("offload: statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
