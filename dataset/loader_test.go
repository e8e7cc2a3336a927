package dataset

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// raceEnabled is set by loader_race_test.go under -race, where allocation
// counts are not meaningful.
var raceEnabled bool

// fakeSource is an in-memory Source. Sample i holds i as a little-endian
// uint64 followed by bytes derived from i. With alias set it returns its own
// memory (like an mmap); otherwise it writes into dst (like decompression).
type fakeSource struct {
	n     int64
	ss    int
	data  []byte
	alias bool

	failAt int64 // sample index that fails with a *ShardError; -1 for none
	gate   chan struct{}

	mu      sync.Mutex
	advised int64 // samples covered by Advise calls
	ranges  [][2]int64
}

func newFakeSource(n int64, ss int, alias bool) *fakeSource {
	f := &fakeSource{n: n, ss: ss, alias: alias, failAt: -1, data: make([]byte, n*int64(ss))}
	for i := range n {
		s := f.data[i*int64(ss) : (i+1)*int64(ss)]
		fillSample(s, i)
	}
	return f
}

func fillSample(s []byte, i int64) {
	binary.LittleEndian.PutUint64(s, uint64(i))
	for k := 8; k < len(s); k++ {
		s[k] = byte(int64(k) * (i + 1))
	}
}

func (f *fakeSource) Len() int64      { return f.n }
func (f *fakeSource) SampleSize() int { return f.ss }
func (f *fakeSource) Sample(i int64, dst []byte) ([]byte, error) {
	if f.gate != nil {
		<-f.gate
	}
	if i < 0 || i >= f.n {
		return nil, fmt.Errorf("fake: index %d out of range", i)
	}
	if i == f.failAt {
		return nil, &ShardError{Shard: "shard-00007.bin", Chunk: 3, Offset: 4096, Err: ErrChecksum}
	}
	s := f.data[i*int64(f.ss) : (i+1)*int64(f.ss)]
	if f.alias {
		return s, nil
	}
	if cap(dst) < f.ss {
		dst = make([]byte, f.ss)
	}
	dst = dst[:f.ss]
	copy(dst, s)
	return dst, nil
}

// advisingSource adds the optional Advise method.
type advisingSource struct{ *fakeSource }

func (a advisingSource) Advise(from, to int64) {
	a.mu.Lock()
	a.advised += to - from
	if len(a.ranges) < 1000 {
		a.ranges = append(a.ranges, [2]int64{from, to})
	}
	a.mu.Unlock()
}

// drain reads n batches (n < 0: until io.EOF), checks that each batch's
// data matches its indices, and returns the batches' indices and cursors.
func drain(t *testing.T, l *Loader, n int) (idx [][]int64, cursors []Cursor) {
	t.Helper()
	ctx := context.Background()
	for k := 0; n < 0 || k < n; k++ {
		b, err := l.Next(ctx)
		if errors.Is(err, io.EOF) && n < 0 {
			break
		}
		if err != nil {
			t.Fatalf("Next after %d batches: %v", k, err)
		}
		ss := len(b.Data) / b.Samples
		if len(b.Data) != b.Samples*ss || len(b.Indices) != b.Samples {
			t.Fatalf("batch %d: %d bytes, %d indices for %d samples", k, len(b.Data), len(b.Indices), b.Samples)
		}
		want := make([]byte, ss)
		for j, i := range b.Indices {
			fillSample(want, i)
			if !slices.Equal(b.Data[j*ss:(j+1)*ss], want) {
				t.Fatalf("batch %d sample %d (index %d): data does not match", k, j, i)
			}
		}
		idx = append(idx, slices.Clone(b.Indices))
		cursors = append(cursors, b.Cursor)
		b.Release()
	}
	return idx, cursors
}

func newLoader(t *testing.T, src Source, opts LoaderOptions) *Loader {
	t.Helper()
	l, err := NewLoader(context.Background(), src, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestLoaderEpochsArePermutations(t *testing.T) {
	const n, bs = 50, 7
	src := newFakeSource(n, 16, true)
	l := newLoader(t, src, LoaderOptions{BatchSize: bs, Shuffle: true, Seed: 9, Epochs: 3, Workers: 3})
	batches, cursors := drain(t, l, -1)
	perEpoch := (n + bs - 1) / bs
	if len(batches) != 3*perEpoch {
		t.Fatalf("%d batches, want %d", len(batches), 3*perEpoch)
	}
	var orders [][]int64
	for e := range 3 {
		var order []int64
		for k, b := range batches[e*perEpoch : (e+1)*perEpoch] {
			wantLen := bs
			if k == perEpoch-1 {
				wantLen = n - (perEpoch-1)*bs
			}
			if len(b) != wantLen {
				t.Fatalf("epoch %d batch %d has %d samples, want %d", e, k, len(b), wantLen)
			}
			order = append(order, b...)
		}
		sorted := slices.Sorted(slices.Values(order))
		for i, v := range sorted {
			if v != int64(i) {
				t.Fatalf("epoch %d is not a permutation of [0,%d): %v", e, n, sorted)
			}
		}
		orders = append(orders, order)
	}
	if slices.Equal(orders[0], orders[1]) || slices.Equal(orders[1], orders[2]) {
		t.Fatal("consecutive epochs have the same order")
	}
	if got, want := cursors[perEpoch-1], (Cursor{Seed: 9, Epoch: 1}); got != want {
		t.Fatalf("cursor after epoch 0 = %v, want %v", got, want)
	}
	if got, want := cursors[0], (Cursor{Seed: 9, Epoch: 0, Position: bs}); got != want {
		t.Fatalf("cursor after first batch = %v, want %v", got, want)
	}
	// The same seed gives the same stream; another seed another one.
	again, _ := drain(t, newLoader(t, src, LoaderOptions{BatchSize: bs, Shuffle: true, Seed: 9, Epochs: 3, Workers: 1}), -1)
	if !slices.EqualFunc(batches, again, slices.Equal) {
		t.Fatal("same seed gave a different stream")
	}
	other, _ := drain(t, newLoader(t, src, LoaderOptions{BatchSize: bs, Shuffle: true, Seed: 10, Epochs: 1}), -1)
	if slices.EqualFunc(batches[:perEpoch], other, slices.Equal) {
		t.Fatal("different seeds gave the same epoch")
	}
}

func TestLoaderSingleEpochEOF(t *testing.T) {
	src := newFakeSource(20, 8, false)
	l := newLoader(t, src, LoaderOptions{BatchSize: 6, Epochs: 1, DropLast: true})
	if got := l.BatchesPerEpoch(); got != 3 {
		t.Fatalf("BatchesPerEpoch = %d, want 3", got)
	}
	batches, cursors := drain(t, l, 3)
	want := [][]int64{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}, {12, 13, 14, 15, 16, 17}}
	if !slices.EqualFunc(batches, want, slices.Equal) {
		t.Fatalf("unshuffled batches %v, want %v", batches, want)
	}
	if cursors[2] != (Cursor{Epoch: 1}) {
		t.Fatalf("cursor after the last full batch = %v, want epoch 1 position 0", cursors[2])
	}
	for range 2 {
		if _, err := l.Next(context.Background()); err != io.EOF {
			t.Fatalf("Next after the last epoch = %v, want io.EOF", err)
		}
	}
}

func TestLoaderResumeIsExact(t *testing.T) {
	const n = 23
	src := newFakeSource(n, 8, true)
	for _, dropLast := range []bool{false, true} {
		for _, shuffle := range []bool{false, true} {
			opts := LoaderOptions{BatchSize: 5, Shuffle: shuffle, Seed: 77, DropLast: dropLast, Workers: 2, Prefetch: 3}
			full, cursors := drain(t, newLoader(t, src, opts), 20) // about 4 epochs
			for stop := 0; stop < len(full); stop++ {
				o := opts
				if stop > 0 {
					// Round-trip the cursor through JSON, as a checkpoint does.
					js, err := json.Marshal(cursors[stop-1])
					if err != nil {
						t.Fatal(err)
					}
					if err := json.Unmarshal(js, &o.Start); err != nil {
						t.Fatal(err)
					}
				}
				l := newLoader(t, src, o)
				rest, _ := drain(t, l, len(full)-stop)
				l.Close()
				if !slices.EqualFunc(full[stop:], rest, slices.Equal) {
					t.Fatalf("dropLast=%v shuffle=%v: resuming after batch %d (cursor %v) gives %v, want %v",
						dropLast, shuffle, stop, o.Start, rest, full[stop:])
				}
			}
		}
	}
}

func TestLoaderRanksCoverEpochOnce(t *testing.T) {
	const n, w, bs = 50, 3, 4
	for _, keepTail := range []bool{false, true} {
		owner := map[[2]int64]int{} // (epoch, index) -> rank
		counts := make([]int, w)
		for r := range w {
			l := newLoader(t, newFakeSource(n, 8, r%2 == 0), LoaderOptions{
				BatchSize: bs, Shuffle: true, Seed: 3, Rank: r, WorldSize: w, KeepTail: keepTail, Epochs: 2, Workers: r + 1,
			})
			batches, _ := drain(t, l, -1)
			epoch := int64(0)
			got := 0
			for _, b := range batches {
				for _, i := range b {
					if got == int(l.EpochLen()) {
						epoch, got = epoch+1, 0
					}
					key := [2]int64{epoch, i}
					if prev, dup := owner[key]; dup {
						t.Fatalf("keepTail=%v epoch %d: sample %d read by rank %d and rank %d", keepTail, epoch, i, prev, r)
					}
					owner[key] = r
					got++
					counts[r]++
				}
			}
		}
		perEpoch := n - n%w
		if keepTail {
			perEpoch = n
		}
		if len(owner) != 2*perEpoch {
			t.Fatalf("keepTail=%v: %d (epoch, sample) pairs read, want %d", keepTail, len(owner), 2*perEpoch)
		}
		if !keepTail && (counts[0] != counts[1] || counts[1] != counts[2]) {
			t.Fatalf("ranks not in lockstep: %v samples", counts)
		}
	}
}

func TestLoaderWorkerCountInvariant(t *testing.T) {
	const n = 97
	var ref [][]int64
	var refCursors []Cursor
	for _, workers := range []int{1, 2, 5, 8} {
		for _, alias := range []bool{false, true} {
			src := newFakeSource(n, 24, alias)
			l := newLoader(t, src, LoaderOptions{BatchSize: 8, Shuffle: true, Seed: 1, Workers: workers, Prefetch: workers + 1})
			got, cursors := drain(t, l, 40)
			if ref == nil {
				ref, refCursors = got, cursors
				continue
			}
			if !slices.EqualFunc(ref, got, slices.Equal) || !slices.Equal(refCursors, cursors) {
				t.Fatalf("workers=%d alias=%v: stream differs from workers=1", workers, alias)
			}
		}
	}
}

func TestLoaderNoAllocsPerBatch(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	for _, alias := range []bool{false, true} {
		src := advisingSource{newFakeSource(1000, 64, alias)}
		l := newLoader(t, src, LoaderOptions{BatchSize: 16, Shuffle: true, Workers: 2, Prefetch: 4})
		ctx := context.Background()
		step := func() {
			b, err := l.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b.Release()
		}
		for range 200 { // warm-up, across several epochs
			step()
		}
		if a := testing.AllocsPerRun(300, step); a != 0 {
			t.Fatalf("alias=%v: %.2f allocations per batch, want 0", alias, a)
		}
	}
}

func TestLoaderAdvise(t *testing.T) {
	src := advisingSource{newFakeSource(40, 8, true)}
	l := newLoader(t, src, LoaderOptions{BatchSize: 10, Epochs: 1, Workers: 1})
	drain(t, l, -1)
	l.Close()
	want := [][2]int64{{0, 10}, {10, 20}, {20, 30}, {30, 40}}
	if !slices.Equal(src.ranges, want) {
		t.Fatalf("unshuffled Advise ranges %v, want %v", src.ranges, want)
	}

	for _, all := range []bool{false, true} {
		src = advisingSource{newFakeSource(40, 8, true)}
		l = newLoader(t, src, LoaderOptions{BatchSize: 10, Epochs: 1, Shuffle: true, AdviseAll: all})
		drain(t, l, -1)
		l.Close()
		want := int64(0) // isolated samples are not advised by default
		if all {
			want = 40
		}
		if src.advised != want {
			t.Fatalf("shuffled, AdviseAll=%v: Advise covered %d samples, want %d", all, src.advised, want)
		}
	}
}

func TestLoaderCallerBuffers(t *testing.T) {
	const bs, ss = 4, 16
	bufs := make([][]byte, 3)
	for i := range bufs {
		bufs[i] = make([]byte, bs*ss+5)
	}
	l := newLoader(t, newFakeSource(30, ss, false), LoaderOptions{BatchSize: bs, Buffers: bufs, Workers: 2})
	for k := range 10 {
		b, err := l.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		in := false
		for _, buf := range bufs {
			in = in || &b.Data[0] == &buf[0]
		}
		if !in {
			t.Fatalf("batch %d does not lie in a caller buffer", k)
		}
		b.Release()
		b.Release() // extra Release is harmless
	}
}

func TestLoaderAllBuffersHeld(t *testing.T) {
	l := newLoader(t, newFakeSource(30, 8, true), LoaderOptions{BatchSize: 2, Prefetch: 2, Workers: 1})
	ctx := context.Background()
	b1, err := l.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := l.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Next(ctx); err == nil || !strings.Contains(err.Error(), "Release") {
		t.Fatalf("Next with every buffer held = %v, want an error asking for Release", err)
	}
	b1.Release()
	b3, err := l.Next(ctx)
	if err != nil {
		t.Fatalf("Next after Release: %v", err)
	}
	if b3.Indices[0] != 4 {
		t.Fatalf("third batch starts at %d, want 4", b3.Indices[0])
	}
	b2.Release()
	b3.Release()
}

func TestLoaderSampleErrorPropagates(t *testing.T) {
	src := newFakeSource(40, 8, false)
	src.failAt = 13
	l := newLoader(t, src, LoaderOptions{BatchSize: 5, Workers: 4})
	got, _ := drain(t, l, 2) // samples 0..9 are fine
	if len(got) != 2 {
		t.Fatalf("got %d good batches, want 2", len(got))
	}
	for range 2 {
		_, err := l.Next(context.Background())
		var se *ShardError
		if !errors.As(err, &se) || !errors.Is(err, ErrChecksum) {
			t.Fatalf("Next = %v, want a *ShardError wrapping ErrChecksum", err)
		}
		if !strings.Contains(err.Error(), "sample 13") || !strings.Contains(err.Error(), "shard-00007.bin chunk 3") {
			t.Fatalf("error %q does not name the sample index and the shard chunk", err)
		}
	}
}

// waitGoroutines waits until at most n goroutines are running.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines still running, want at most %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLoaderCloseAndCancelDoNotLeak(t *testing.T) {
	base := runtime.NumGoroutine()

	// Close while the pipeline is full (nobody consuming) and one batch held.
	l, err := NewLoader(context.Background(), newFakeSource(100, 8, false), LoaderOptions{BatchSize: 3, Workers: 4, Prefetch: 6})
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // let the pipeline fill up and block
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	waitGoroutines(t, base)
	b.Release() // after Close: harmless
	if _, err := l.Next(context.Background()); !errors.Is(err, ErrLoaderClosed) {
		t.Fatalf("Next after Close = %v, want ErrLoaderClosed", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// Cancel the loader's context while workers are stuck in Sample.
	src := newFakeSource(100, 8, false)
	src.gate = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	l, err = NewLoader(ctx, src, LoaderOptions{BatchSize: 3, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	nextErr := make(chan error, 1)
	go func() {
		_, err := l.Next(context.Background())
		nextErr <- err
	}()
	time.Sleep(10 * time.Millisecond)
	cancel()
	if err := <-nextErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("Next after cancel = %v, want context.Canceled", err)
	}
	close(src.gate) // the blocked Sample calls return; the workers see the cancellation
	waitGoroutines(t, base+1)
	l.Close()
	waitGoroutines(t, base)
}

func TestLoaderNextContextDeadlineKeepsLoaderUsable(t *testing.T) {
	src := newFakeSource(20, 8, true)
	src.gate = make(chan struct{})
	l := newLoader(t, src, LoaderOptions{BatchSize: 4, Workers: 2, Epochs: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next with a blocked source = %v, want DeadlineExceeded", err)
	}
	close(src.gate)
	batches, _ := drain(t, l, -1)
	if len(batches) != 5 || batches[0][0] != 0 {
		t.Fatalf("after the deadline the loader gave %v, want the 5 batches from the start", batches)
	}
}

func TestLoaderOptionErrors(t *testing.T) {
	src := newFakeSource(10, 8, true)
	for _, tc := range []struct {
		opts LoaderOptions
		want []string
	}{
		{LoaderOptions{}, []string{"BatchSize 0"}},
		{LoaderOptions{BatchSize: 4, Prefetch: -1, Workers: -1}, []string{"Prefetch -1", "Workers -1"}},
		{LoaderOptions{BatchSize: 4, Rank: 3, WorldSize: 2}, []string{"Rank 3"}},
		{LoaderOptions{BatchSize: 4, WorldSize: 11}, []string{"only 0 samples per epoch"}},
		{LoaderOptions{BatchSize: 11, DropLast: true}, []string{"not one batch of 11"}},
		{LoaderOptions{BatchSize: 4, Buffers: [][]byte{make([]byte, 31)}}, []string{"Buffers[0] has 31 bytes, a batch needs 32"}},
		{LoaderOptions{BatchSize: 4, Prefetch: 2, Buffers: [][]byte{make([]byte, 32)}}, []string{"Prefetch 2 differs from the 1 Buffers"}},
		{LoaderOptions{BatchSize: 4, Seed: 1, Start: Cursor{Seed: 2, Epoch: 1}}, []string{"seed 2 but Seed is 1"}},
		{LoaderOptions{BatchSize: 4, Start: Cursor{Position: 11}}, []string{"position 11 is past the end"}},
		{LoaderOptions{BatchSize: 4, Epochs: -1}, []string{"Epochs -1"}},
	} {
		l, err := NewLoader(context.Background(), src, tc.opts)
		if err == nil {
			l.Close()
			t.Errorf("NewLoader(%+v) succeeded", tc.opts)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("NewLoader(%+v) = %q, want it to mention %q", tc.opts, err, w)
			}
		}
	}
	if _, err := NewLoader(context.Background(), &fakeSource{n: 10}, LoaderOptions{BatchSize: 1}); err == nil ||
		!strings.Contains(err.Error(), "no fixed sample size") {
		t.Errorf("NewLoader on a variable-size source = %v, want a sample size error", err)
	}
}

// writeTokenDataset writes a uint16 token dataset of the given stream into
// a new directory under t.TempDir() and opens it.
func writeTokenDataset(tb testing.TB, tokens []uint16, seqLen int, opts WriterOptions) *Dataset {
	tb.Helper()
	opts.Schema = Schema{Kind: KindTokens, TokenDType: "uint16", SeqLen: seqLen, VocabSize: 1 << 16}
	dir := tb.TempDir() + "/ds"
	w, err := Create(context.Background(), dir, opts)
	if err != nil {
		tb.Fatal(err)
	}
	raw := make([]byte, 2*len(tokens))
	for i, v := range tokens {
		binary.LittleEndian.PutUint16(raw[2*i:], v)
	}
	for len(raw) > 0 { // several writes, as a converter would do
		k := min(len(raw), 1000)
		if _, err := w.Write(raw[:k]); err != nil {
			tb.Fatal(err)
		}
		raw = raw[k:]
	}
	if _, err := w.Commit(context.Background()); err != nil {
		tb.Fatal(err)
	}
	d, err := Open(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

func TestLoaderOnRealDataset(t *testing.T) {
	const seqLen = 15
	tokens := make([]uint16, 20000)
	for i := range tokens {
		tokens[i] = uint16(mix64(uint64(i)) % 300) // compressible
	}
	n := int64(len(tokens)-1) / seqLen
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		d := writeTokenDataset(t, tokens, seqLen, WriterOptions{ShardSize: 8 << 10, ChunkSize: 1000, Compression: comp})
		if d.Len() != n || d.SampleSize() != 2*(seqLen+1) {
			t.Fatalf("%s: dataset has %d samples of %d bytes, want %d of %d", comp, d.Len(), d.SampleSize(), n, 2*(seqLen+1))
		}
		seen := make(map[int64]bool)
		for r := range 2 {
			l := newLoader(t, d, LoaderOptions{BatchSize: 32, Shuffle: true, Seed: 4, Rank: r, WorldSize: 2, KeepTail: true, Epochs: 1, Workers: 3})
			for {
				b, err := l.Next(context.Background())
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("%s: %v", comp, err)
				}
				for k, i := range b.Indices {
					s := b.Data[k*d.SampleSize() : (k+1)*d.SampleSize()]
					for j := range seqLen + 1 {
						if got, want := binary.LittleEndian.Uint16(s[2*j:]), tokens[i*seqLen+int64(j)]; got != want {
							t.Fatalf("%s: sample %d token %d = %d, want %d", comp, i, j, got, want)
						}
					}
					if seen[i] {
						t.Fatalf("%s: sample %d delivered twice", comp, i)
					}
					seen[i] = true
				}
				b.Release()
			}
		}
		if int64(len(seen)) != n {
			t.Fatalf("%s: %d samples delivered in one epoch over 2 ranks, want %d", comp, len(seen), n)
		}
	}
}

func TestLoaderReportsCorruptShard(t *testing.T) {
	tokens := make([]uint16, 5000)
	for i := range tokens {
		tokens[i] = uint16(i)
	}
	d := writeTokenDataset(t, tokens, 7, WriterOptions{ChunkSize: 1024})
	dir := d.Dir()
	d.Close()
	shard := dir + "/" + d.Manifest().Shards[0].Name
	raw, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	raw[headerSize+2000] ^= 0xff // inside chunk 1: raw bytes [1024, 2048)
	if err := os.WriteFile(shard, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() }) // after the loader's Close (cleanups run last first)
	l := newLoader(t, d, LoaderOptions{BatchSize: 50, Workers: 2, Epochs: 1})
	if _, err := l.Next(context.Background()); err != nil {
		t.Fatalf("first batch (chunk 0 only): %v", err)
	}
	_, err = l.Next(context.Background())
	var se *ShardError
	if !errors.As(err, &se) || !errors.Is(err, ErrChecksum) || se.Chunk != 1 {
		t.Fatalf("second batch = %v, want a checksum *ShardError for chunk 1", err)
	}
	// Sample i covers raw bytes [14i, 14i+16): the first to reach chunk 1 is 73.
	if !strings.Contains(err.Error(), "sample 73 ") || !strings.Contains(err.Error(), se.Shard) {
		t.Fatalf("error %q does not name the first bad sample and the shard", err)
	}
}

func TestLoaderResumeWithEpochLimit(t *testing.T) {
	src := newFakeSource(30, 8, true)
	opts := LoaderOptions{BatchSize: 4, Shuffle: true, Seed: 2, Epochs: 3}
	full, cursors := drain(t, newLoader(t, src, opts), -1)
	if len(full) != 3*8 {
		t.Fatalf("%d batches in 3 epochs, want 24", len(full))
	}
	opts.Start = cursors[10] // inside epoch 1
	rest, _ := drain(t, newLoader(t, src, opts), -1)
	if !slices.EqualFunc(full[11:], rest, slices.Equal) {
		t.Fatalf("resumed run with Epochs=3 gave %d batches, want the last %d of the full run", len(rest), len(full)-11)
	}
	js, err := json.Marshal(cursors[10])
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"seed":2,"epoch":1,"position":12}`; string(js) != want {
		t.Fatalf("cursor JSON %s, want %s", js, want)
	}
}

// TestLoaderRanksMatchOneBigBatch is what data parallelism needs of the
// sharding: with DropLast, the batches of step s of W ranks with batch B
// together hold exactly the samples of step s of one rank with batch W*B,
// every epoch; and a rank's stream does not depend on its worker count.
func TestLoaderRanksMatchOneBigBatch(t *testing.T) {
	const n, bs = 103, 4
	for _, w := range []int{2, 3, 4} {
		one := newLoader(t, newFakeSource(n, 8, false), LoaderOptions{BatchSize: w * bs, Shuffle: true, Seed: 9, DropLast: true, Epochs: 3})
		want, _ := drain(t, one, -1)
		per := make([][][]int64, w)
		for r := range w {
			var again [][]int64
			for _, workers := range []int{1, 3} {
				l := newLoader(t, newFakeSource(n, 8, false), LoaderOptions{
					BatchSize: bs, Shuffle: true, Seed: 9, DropLast: true, Epochs: 3, Rank: r, WorldSize: w, Workers: workers,
				})
				got, _ := drain(t, l, -1)
				if again != nil && !slices.EqualFunc(again, got, slices.Equal) {
					t.Fatalf("w=%d rank %d: the stream depends on the worker count", w, r)
				}
				again = got
			}
			per[r] = again
		}
		for r := range w {
			if len(per[r]) != len(want) {
				t.Fatalf("w=%d: rank %d has %d steps, one rank with batch %d has %d", w, r, len(per[r]), w*bs, len(want))
			}
		}
		for s := range want {
			var union []int64
			for r := range w {
				union = append(union, per[r][s]...)
			}
			slices.Sort(union)
			ref := slices.Sorted(slices.Values(want[s]))
			if !slices.Equal(union, ref) {
				t.Fatalf("w=%d step %d: the ranks read %v, one big batch %v", w, s, union, ref)
			}
		}
	}
}
