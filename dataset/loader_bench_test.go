package dataset

import (
	"context"
	"fmt"
	"runtime"
	"testing"
)

// Benchmark shape: GPT-style batches of 512 windows of 1025 uint16 tokens
// (SeqLen 1024), drawn in shuffled order from a dataset of benchTokens
// byte-level tokens of synthetic text (compressible about like real text).
// The dataset is written once per run into b.TempDir(), so it is in the
// page cache: the numbers measure the loader and the format, not the disk.
const (
	benchSeqLen = 1024
	benchBatch  = 512
	benchTokens = 32 << 20 // 64 MiB of uint16 tokens, ~32k samples
)

// benchText returns n tokens of pseudo-English: words from a small
// vocabulary with a skewed distribution, separated by spaces, with an
// end-of-text token (256) now and then, as the byte-level tokenizer makes.
func benchText(n int) []uint16 {
	words := []string{"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with",
		"be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
		"an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
		"memory", "gradient", "tensor", "layer", "offload", "stream", "dataset", "shard", "checkpoint"}
	out := make([]uint16, 0, n+16)
	state := uint64(1)
	for len(out) < n {
		state += splitmixGamma
		r := mix64(state)
		// Skew: squaring a uniform picks low indices (common words) more often.
		u := float64(r>>11) / (1 << 53)
		w := words[int(u*u*float64(len(words)))]
		for i := range len(w) {
			out = append(out, uint16(w[i]))
		}
		switch {
		case r%97 == 0:
			out = append(out, 256)
		case r%13 == 0:
			out = append(out, '.', ' ')
		default:
			out = append(out, ' ')
		}
	}
	return out[:n]
}

func BenchmarkLoader(b *testing.B) {
	tokens := benchText(benchTokens)
	p := runtime.GOMAXPROCS(0)
	// Samples per 1 MiB chunk: a sample starts every SeqLen tokens.
	chunkSamples := int64(DefaultChunkSize / (2 * benchSeqLen))
	type run struct {
		name    string
		workers int
		opts    LoaderOptions
	}
	for _, tc := range []struct {
		name string
		opts WriterOptions
		runs []run
	}{
		{"none", WriterOptions{Compression: CompressionNone}, []run{
			{"shuffle", 1, LoaderOptions{}},
			{"shuffle", p, LoaderOptions{}},
			{"shuffle-adviseall", p, LoaderOptions{AdviseAll: true}},
			{"block", p, LoaderOptions{BlockSamples: chunkSamples, WindowBlocks: 16}},
		}},
		{"zstd", WriterOptions{Compression: CompressionZstd}, []run{
			{"shuffle", p, LoaderOptions{}},
			{"block", 1, LoaderOptions{BlockSamples: chunkSamples, WindowBlocks: 16}},
			{"block", p, LoaderOptions{BlockSamples: chunkSamples, WindowBlocks: 16}},
			// A window that fits the Dataset's chunk cache (2*GOMAXPROCS+2).
			{"block-w4", p, LoaderOptions{BlockSamples: chunkSamples, WindowBlocks: 4}},
		}},
	} {
		d := writeTokenDataset(b, tokens, benchSeqLen, tc.opts)
		m := d.Manifest()
		b.Logf("%s: %d samples, %d raw bytes stored as %d (%.2fx), chunk %d", tc.name, d.Len(),
			int64(len(tokens))*2, m.StoredBytes, float64(len(tokens)*2)/float64(m.StoredBytes), m.ChunkSize)
		for _, r := range tc.runs {
			name := fmt.Sprintf("%s/%s/workers=%d", tc.name, r.name, r.workers)
			b.Run(name, func(b *testing.B) { benchLoader(b, d, r.workers, r.opts) })
		}
	}
}

func benchLoader(b *testing.B, src Source, workers int, opts LoaderOptions) {
	opts.BatchSize, opts.Shuffle, opts.Seed, opts.DropLast, opts.Workers = benchBatch, true, 1, true, workers
	l, err := NewLoader(context.Background(), src, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	next := func() {
		bt, err := l.Next(ctx)
		if err != nil {
			b.Fatal(err)
		}
		bt.Release()
	}
	for range 4 { // warm-up: fill the pipeline, grow caches
		next()
	}
	b.SetBytes(int64(benchBatch * src.SampleSize()))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		next()
	}
}

// BenchmarkGatherDirect is the baseline for BenchmarkLoader: one goroutine
// copying the same shuffled batches with Sample, no pipeline.
func BenchmarkGatherDirect(b *testing.B) {
	d := writeTokenDataset(b, benchText(benchTokens), benchSeqLen, WriterOptions{})
	ss := d.SampleSize()
	buf := make([]byte, benchBatch*ss)
	s, err := NewSampler(d.Len(), SamplerOptions{Shuffle: true, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	order, pos := s.Order(0), int64(0)
	b.SetBytes(int64(benchBatch * ss))
	b.ReportAllocs()
	for b.Loop() {
		if pos+benchBatch > order.Len() {
			pos = 0
		}
		for k := range int64(benchBatch) {
			got, err := d.Sample(order.At(pos+k), buf[k*int64(ss):(k+1)*int64(ss)])
			if err != nil {
				b.Fatal(err)
			}
			copy(buf[k*int64(ss):], got)
		}
		pos += benchBatch
	}
}
