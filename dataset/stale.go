package dataset

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A Writer builds its dataset in a temporary directory next to the target,
// ".NAME.tmp-*", and holds an exclusive lock on that directory (flock, where
// the system has it) until it commits or aborts. A process killed while
// converting leaves the directory behind, unlocked; the next Create of the
// same NAME removes it (see RemoveStaleTemps).

// StaleTemp is a temporary directory left by an interrupted writer.
type StaleTemp struct {
	Path  string
	Bytes int64 // total size of its files
}

// RemoveStaleTemps removes the temporary directories that interrupted
// writers of the dataset dir left in its parent: those named ".NAME.tmp-*"
// whose lock no live writer holds. It returns what it removed. Where
// directories cannot be locked (not unix), it removes nothing.
func RemoveStaleTemps(dir string) ([]StaleTemp, error) {
	dir = filepath.Clean(dir)
	parent, base := filepath.Split(dir)
	if parent == "" {
		parent = "."
	}
	ents, err := os.ReadDir(parent)
	if err != nil {
		return nil, nil // nothing to clean (Create reports a bad parent)
	}
	var removed []StaleTemp
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "."+base+".tmp-") {
			continue
		}
		p := filepath.Join(parent, e.Name())
		unlock, ok := tryLockDir(p)
		if !ok {
			continue // a live writer's, or cannot tell
		}
		size := dirBytes(p)
		err := os.RemoveAll(p)
		unlock()
		if err != nil {
			return removed, fmt.Errorf("dataset: removing %s, left by an interrupted writer: %w", p, err)
		}
		removed = append(removed, StaleTemp{Path: p, Bytes: size})
	}
	return removed, nil
}

// dirBytes is the total size of the regular files under p.
func dirBytes(p string) int64 {
	var n int64
	filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
