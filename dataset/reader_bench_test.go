package dataset

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// BenchmarkScan compares a sequential scan of every sample (copied into a batch buffer, as
// a loader does) of an uncompressed and a zstd dataset with a plain copy of the same
// windows from memory. Bytes per op are the decompressed sample bytes of one full scan.
//
//	go test ./dataset -run XXX -bench BenchmarkScan -benchtime 5x -cpu 1
func BenchmarkScan(b *testing.B) {
	const seqLen, nTok = 1024, 16 << 20 // 32 MiB of uint16 tokens
	r := rand.New(rand.NewPCG(7, 7))
	txt := textish(r, nTok)
	stream := make([]byte, 2*nTok)
	for i, c := range txt {
		binary.LittleEndian.PutUint16(stream[2*i:], uint16(c))
	}
	schema := Schema{Kind: KindTokens, TokenDType: "uint16", SeqLen: seqLen}
	open := func(comp Compression) *Dataset {
		dir := filepath.Join(b.TempDir(), "ds")
		w, err := Create(context.Background(), dir, WriterOptions{Schema: schema, ShardSize: 8 << 20, Compression: comp})
		if err != nil {
			b.Fatal(err)
		}
		w.Write(stream)
		if _, err := w.Commit(context.Background()); err != nil {
			b.Fatal(err)
		}
		d, err := Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Close() })
		return d
	}
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
