//go:build !unix

package dataset

// lockDir is a no-op where flock is not available.
func lockDir(string) func() { return func() {} }

// tryLockDir cannot tell a live writer's directory from a stale one here,
// so it reports every directory as held.
func tryLockDir(string) (func(), bool) { return nil, false }
