package dataset

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// benchStream returns n text-like uint16 tokens, little-endian.
func benchStream(n int) []byte {
	r := rand.New(rand.NewPCG(7, 7))
	txt := textish(r, n)
	stream := make([]byte, 2*n)
	for i, c := range txt {
		binary.LittleEndian.PutUint16(stream[2*i:], uint16(c))
	}
	return stream
}

// benchDataset writes stream as a uint16 token dataset (1 MiB chunks, 8 MiB shards) and
// opens it; it is closed when the benchmark ends.
func benchDataset(b *testing.B, stream []byte, seqLen int, comp Compression, opts OpenOptions) *Dataset {
	b.Helper()
	schema := Schema{Kind: KindTokens, TokenDType: "uint16", SeqLen: seqLen}
	dir := filepath.Join(b.TempDir(), "ds")
	w, err := Create(context.Background(), dir, WriterOptions{Schema: schema, ShardSize: 8 << 20, Compression: comp})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := w.Write(stream); err != nil {
		b.Fatal(err)
	}
	if _, err := w.Commit(context.Background()); err != nil {
		b.Fatal(err)
	}
	d, err := OpenWithOptions(dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

// BenchmarkScan compares a sequential scan of every sample (copied into a batch buffer, as
// a loader does) of an uncompressed and a zstd dataset with a plain copy of the same
// windows from memory. Bytes per op are the decompressed sample bytes of one full scan.
//
//	go test ./dataset -run XXX -bench BenchmarkScan -benchtime 5x -cpu 1
func BenchmarkScan(b *testing.B) {
	const seqLen, nTok = 1024, 16 << 20 // 32 MiB of uint16 tokens
	stream := benchStream(nTok)
	open := func(comp Compression) *Dataset { return benchDataset(b, stream, seqLen, comp, OpenOptions{}) }
	none, zst := open(CompressionNone), open(CompressionZstd)
	n, ss, stride := none.Len(), none.SampleSize(), seqLen*2
	total := n * int64(ss)
	b.Logf("%d samples of %d bytes; zstd stores %d of %d bytes", n, ss, zst.Manifest().StoredBytes, zst.Manifest().RawBytes)
	batch := make([]byte, 64*ss)
	put := func(i int64, s []byte) { copy(batch[int(i%64)*ss:], s) }

	b.Run("copy", func(b *testing.B) {
		b.SetBytes(total)
		b.ReportAllocs()
		for b.Loop() {
			for i := range n {
				put(i, stream[int(i)*stride:int(i)*stride+ss])
			}
		}
	})
	b.Run("none", func(b *testing.B) {
		b.SetBytes(total)
		b.ReportAllocs()
		for b.Loop() {
			for i := range n {
				s, err := none.Sample(i, nil)
				if err != nil {
					b.Fatal(err)
				}
				put(i, s)
			}
		}
	})
	b.Run("zstd", func(b *testing.B) {
		b.SetBytes(total)
		b.ReportAllocs()
		dst := make([]byte, ss)
		for b.Loop() {
			for i := range n {
				s, err := zst.Sample(i, dst)
				if err != nil {
					b.Fatal(err)
				}
				put(i, s)
			}
		}
	})
	b.Run("zstd-verify", func(b *testing.B) {
		// Decodes every chunk once (no sample copies): raw decompression throughput.
		b.SetBytes(zst.Manifest().RawBytes)
		b.ReportAllocs()
		for b.Loop() {
			if err := zst.Verify(context.Background(), nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSample measures random access to one sample of a zstd dataset (2050-byte
// samples, 16 chunks of 1 MiB) with a chunk cache of 6 chunks (most random calls decode a
// chunk) and of 32 (all chunks stay decoded): "random" picks samples uniformly; "local"
// picks them within a window of 4 chunks that moves along, as a block-local shuffle does,
// so most calls hit the cache; "parallel" is "random" from GOMAXPROCS goroutines sharing
// the cache. After warm-up no call should allocate.
//
//	go test ./dataset -run XXX -bench BenchmarkSample -benchtime 2000x
func BenchmarkSample(b *testing.B) {
	const seqLen, nTok = 1024, 8 << 20 // 16 MiB of uint16 tokens, 16 chunks
	stream := benchStream(nTok)
	for _, cache := range []int{6, 32} {
		d := benchDataset(b, stream, seqLen, CompressionZstd, OpenOptions{ChunkCache: cache})
		n, ss := d.Len(), d.SampleSize()
		perChunk := int64((1 << 20) / (seqLen * 2))
		name := func(s string) string { return fmt.Sprintf("%s/cache=%d", s, cache) }
		b.Run(name("random"), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 1))
			dst := make([]byte, ss)
			b.SetBytes(int64(ss))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.Sample(r.Int64N(n), dst); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name("local"), func(b *testing.B) {
			r := rand.New(rand.NewPCG(2, 2))
			dst := make([]byte, ss)
			b.SetBytes(int64(ss))
			b.ReportAllocs()
			k := int64(0)
			for b.Loop() {
				base := (k / 256) * perChunk % n // the window moves one chunk every 256 calls
				k++
				if _, err := d.Sample((base+r.Int64N(4*perChunk))%n, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name("parallel"), func(b *testing.B) {
			b.SetBytes(int64(ss))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				r := rand.New(rand.NewPCG(rand.Uint64(), 3))
				dst := make([]byte, ss)
				for pb.Next() {
					if _, err := d.Sample(r.Int64N(n), dst); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkDecode decodes 1 MiB chunks of BenchmarkScan's data (text-like uint16 tokens),
// compressed at zstd levels 1-3, with variants of the decoder options, on one goroutine.
// "base" is the options before IgnoreChecksum and WithDecoderLowmem(false) were added;
// "dataset" is zstdDecoderOptions. MB/s are decompressed bytes.
//
//	go test ./dataset -run XXX -bench BenchmarkDecode -benchtime 20x -cpu 1
func BenchmarkDecode(b *testing.B) {
	const chunk = 1 << 20
	stream := benchStream(8 << 20) // 16 MiB
	base := []zstd.DOption{zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(MaxChunkSize), zstd.WithDecodeAllCapLimit(true)}
	variants := []struct {
		name string
		opts []zstd.DOption
	}{
		{"base", base},
		{"ignorechecksum", append(base[:len(base):len(base)], zstd.IgnoreChecksum(true))},
		{"lowmem=false", append(base[:len(base):len(base)], zstd.WithDecoderLowmem(false))},
		{"concurrency=1", append(base[:len(base):len(base)], zstd.WithDecoderConcurrency(1))},
		{"dataset", zstdDecoderOptions},
	}
	for level := 1; level <= 3; level++ {
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.EncoderLevel(level)), zstd.WithEncoderCRC(false), zstd.WithEncoderConcurrency(1))
		if err != nil {
			b.Fatal(err)
		}
		var frames [][]byte
		stored := 0
		for off := 0; off < len(stream); off += chunk {
			f := enc.EncodeAll(stream[off:min(off+chunk, len(stream))], nil)
			frames = append(frames, f)
			stored += len(f)
		}
		enc.Close()
		for _, v := range variants {
			dec, err := zstd.NewReader(nil, v.opts...)
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]byte, 0, chunk)
			b.Run(fmt.Sprintf("level=%d/%s", level, v.name), func(b *testing.B) {
				b.SetBytes(int64(len(stream)))
				b.ReportAllocs()
				for b.Loop() {
					for _, f := range frames {
						out, err := dec.DecodeAll(f, dst[:0])
						if err != nil || len(out) != chunk {
							b.Fatalf("decode: %d bytes, %v", len(out), err)
						}
					}
				}
				b.ReportMetric(float64(len(stream))/float64(stored), "ratio")
			})
			dec.Close()
		}
	}
}
