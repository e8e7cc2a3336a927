package dataset

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Close waits for readers in flight; readers that come after it get ErrClosed. Run with
// -race: before the guard, this faulted on unmapped memory or raced on the shard table.
func TestCloseWhileReading(t *testing.T) {
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		t.Run(string(comp), func(t *testing.T) {
			dir, _, tc := smallCase(t, comp)
			d, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			const readers = 6
			var (
				wg      sync.WaitGroup
				started sync.WaitGroup
				reads   atomic.Int64
				errs    = make(chan error, readers+1)
			)
			started.Add(readers)
			for g := range readers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var dst []byte
					for k := 0; ; k++ {
						if k == 20 {
							started.Done()
						}
						i := int64((k*7919 + g*104729) % len(tc.expect))
						if k%50 == 0 {
							d.Advise(i, i+20)
						}
						got, err := d.ReadSample(i, dst)
						if err != nil {
							if k < 20 {
								started.Done()
							}
							errs <- err
							return
						}
						if !bytes.Equal(got, tc.expect[i]) {
							errs <- errors.New("wrong sample bytes")
							return
						}
						dst = got
						reads.Add(1)
					}
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if err := d.Verify(context.Background(), nil); err != nil {
						errs <- err
						return
					}
				}
			}()
			started.Wait()
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if !errors.Is(err, ErrClosed) {
					t.Errorf("reader ended with %v, want ErrClosed", err)
				}
			}
			if reads.Load() < readers*20 {
				t.Errorf("only %d reads before Close", reads.Load())
			}
			if _, err := d.Sample(0, nil); !errors.Is(err, ErrClosed) {
				t.Errorf("Sample after Close: %v, want ErrClosed", err)
			}
			if err := d.Verify(context.Background(), nil); !errors.Is(err, ErrClosed) {
				t.Errorf("Verify after Close: %v, want ErrClosed", err)
			}
			d.Advise(0, d.Len()) // must not fault
			if d.Len() != int64(len(tc.expect)) {
				t.Errorf("Len after Close: %d", d.Len())
			}
			if err := d.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

// Verify gives way to Close between chunks, and calls progress without holding the guard
// (so progress may even call Close).
func TestCloseDuringVerify(t *testing.T) {
	dir, m, _ := smallCase(t, CompressionZstd)
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	err = d.Verify(context.Background(), func(done, total int64) {
		calls++
		if calls == 2 {
			if err := d.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	if !errors.Is(err, ErrClosed) || calls != 2 {
		t.Fatalf("Verify: %v after %d progress calls, want ErrClosed after 2 (of %d chunks)", err, calls, m.Shards[0].Chunks)
	}
}

// A Loader whose Dataset is closed under it (against its contract) fails with ErrClosed
// instead of crashing: its workers copy through ReadSample.
func TestLoaderSourceClosed(t *testing.T) {
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		t.Run(string(comp), func(t *testing.T) {
			dir, _, tc := smallCase(t, comp)
			d, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			l, err := NewLoader(context.Background(), d, LoaderOptions{BatchSize: 4, Workers: 4, Prefetch: 8, Shuffle: true, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			b, err := l.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			ss := d.SampleSize()
			for k, i := range b.Indices {
				if !bytes.Equal(b.Data[k*ss:(k+1)*ss], tc.expect[i]) {
					t.Fatalf("batch sample %d (index %d) differs", k, i)
				}
			}
			b.Release()
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			for range 1000 {
				b, err := l.Next(context.Background())
				if err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Fatalf("Next after the source closed: %v, want ErrClosed", err)
					}
					return
				}
				b.Release()
			}
			t.Fatal("Loader kept delivering batches from a closed Dataset")
		})
	}
}

// A tiny chunk cache under concurrent readers evicts entries that are still in use;
// every sample must still be right, and after warm-up Sample must not allocate.
func TestChunkCacheOptions(t *testing.T) {
	dir, _, tc := smallCase(t, CompressionZstd)
	if _, err := OpenWithOptions(dir, OpenOptions{ChunkCache: -1}); err == nil || !strings.Contains(err.Error(), "chunk cache") {
		t.Fatalf("ChunkCache -1: %v, want an error", err)
	}
	d, err := OpenWithOptions(dir, OpenOptions{ChunkCache: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.cache.max != 1 {
		t.Fatalf("cache holds %d chunks, want 1", d.cache.max)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []byte
			for k := range 300 {
				i := int64((k*7919 + g*104729) % len(tc.expect))
				got, err := d.Sample(i, dst)
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, tc.expect[i]) {
					errs <- errors.New("wrong sample bytes with a 1-chunk cache")
					return
				}
				dst = got
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if raceEnabled {
		return // the race detector allocates
	}
	dst := make([]byte, d.SampleSize())
	k := 0
	allocs := testing.AllocsPerRun(200, func() {
		k = (k + 7919) % len(tc.expect) // hits and misses
		if _, err := d.Sample(int64(k), dst); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Sample allocates %.2f times per call after warm-up, want 0", allocs)
	}
}
