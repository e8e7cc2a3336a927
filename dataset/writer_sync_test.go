package dataset

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hookSync replaces syncFile for the duration of the test.
func hookSync(t *testing.T, f func(*os.File) error) {
	t.Helper()
	old := syncFile
	syncFile = f
	t.Cleanup(func() { syncFile = old })
}

// writeTokens feeds n uint16 tokens in 1000-byte pieces and returns the first error.
func writeTokens(w *Writer, n int) error {
	p := make([]byte, 1000)
	for left := 2 * n; left > 0; left -= len(p) {
		if _, err := w.Write(p[:min(len(p), left)]); err != nil {
			return err
		}
	}
	return nil
}

func syncTestOpts() WriterOptions {
	return WriterOptions{Schema: Schema{Kind: KindTokens, TokenDType: "uint16", SeqLen: 15},
		ChunkSize: 512, ShardSize: 4096}
}

// Shard files are synced in the background, at most maxShardSyncs at a time, and all of
// them before the manifest.
func TestShardSyncsBeforeManifest(t *testing.T) {
	var (
		mu        sync.Mutex
		order     []string
		inFlight  atomic.Int32
		maxFlight atomic.Int32
	)
	hookSync(t, func(f *os.File) error {
		n := inFlight.Add(1)
		for {
			m := maxFlight.Load()
			if n <= m || maxFlight.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond) // let syncs overlap
		mu.Lock()
		order = append(order, filepath.Base(f.Name()))
		mu.Unlock()
		inFlight.Add(-1)
		return f.Sync()
	})
	dir := filepath.Join(t.TempDir(), "ds")
	w, err := Create(context.Background(), dir, syncTestOpts())
	if err != nil {
		t.Fatal(err)
	}
	if err := writeTokens(w, 20000); err != nil {
		t.Fatal(err)
	}
	m, err := w.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Shards) < 5 {
		t.Fatalf("want several shards, have %d", len(m.Shards))
	}
	if len(order) != len(m.Shards)+1 || order[len(order)-1] != ManifestName {
		t.Fatalf("sync order %v: want every one of %d shards, then %s", order, len(m.Shards), ManifestName)
	}
	seen := map[string]bool{}
	for _, name := range order[:len(order)-1] {
		seen[name] = true
	}
	for _, s := range m.Shards {
		if !seen[s.Name] {
			t.Errorf("shard %s was not synced before the manifest", s.Name)
		}
	}
	if got := maxFlight.Load(); got > maxShardSyncs {
		t.Errorf("%d shard syncs in flight at once, limit %d", got, maxShardSyncs)
	}
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
}

// A failed shard sync fails the writer with an error naming the shard, and nothing is
// left behind.
func TestShardSyncErrorFailsCommit(t *testing.T) {
	injected := errors.New("injected I/O error")
	hookSync(t, func(f *os.File) error {
		if filepath.Base(f.Name()) == "shard-00002.spl" {
			return injected
		}
		return f.Sync()
	})
	parent := t.TempDir()
	w, err := Create(context.Background(), filepath.Join(parent, "ds"), syncTestOpts())
	if err != nil {
		t.Fatal(err)
	}
	err = writeTokens(w, 20000)
	if err == nil {
		_, err = w.Commit(context.Background())
	} else {
		w.Abort()
	}
	if !errors.Is(err, injected) || !strings.Contains(err.Error(), "shard-00002.spl") {
		t.Fatalf("got %v, want the injected error naming shard-00002.spl", err)
	}
	if got := dirEntries(t, parent); len(got) != 0 {
		t.Fatalf("after a failed sync the parent holds %v", got)
	}
}

// Abort waits for background syncs before removing the temporary directory.
func TestAbortWaitsForShardSyncs(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var returned atomic.Bool
	hookSync(t, func(f *os.File) error {
		if filepath.Base(f.Name()) == "shard-00000.spl" {
			close(entered)
			<-release
			defer returned.Store(true)
		}
		return f.Sync()
	})
	parent := t.TempDir()
	w, err := Create(context.Background(), filepath.Join(parent, "ds"), syncTestOpts())
	if err != nil {
		t.Fatal(err)
	}
	if err := writeTokens(w, 3000); err != nil { // two shards
		t.Fatal(err)
	}
	<-entered
	done := make(chan error)
	go func() { done <- w.Abort() }()
	select {
	case err := <-done:
		t.Fatalf("Abort returned (%v) while a shard sync was blocked", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !returned.Load() {
		t.Fatal("Abort returned before the blocked sync finished")
	}
	if got := dirEntries(t, parent); len(got) != 0 {
		t.Fatalf("after Abort the parent holds %v", got)
	}
}
