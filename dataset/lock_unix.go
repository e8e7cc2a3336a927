//go:build unix

package dataset

import (
	"os"
	"syscall"
)

// lockDir takes an exclusive flock on the directory p for a writer; the
// returned function releases it. A lock that cannot be taken is not an
// error: the directory is then only unprotected from RemoveStaleTemps of
// another process, which takes the same lock.
func lockDir(p string) func() {
	unlock, _ := tryLockDir(p)
	if unlock == nil {
		return func() {}
	}
	return unlock
}

// tryLockDir takes an exclusive flock on the directory p without waiting;
// ok is false when another open file holds it (or p cannot be opened).
func tryLockDir(p string) (unlock func(), ok bool) {
	f, err := os.Open(p)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return func() { f.Close() }, true
}
