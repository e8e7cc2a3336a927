package dataset

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// testCase describes a dataset to write and the samples expected back.
type testCase struct {
	name   string
	opts   WriterOptions
	feed   func(t testing.TB, w *Writer)
	expect [][]byte
}

// textish returns n compressible bytes (words from a small vocabulary).
func textish(r *rand.Rand, n int) []byte {
	words := []string{"the ", "spill ", "shard ", "token ", "window ", "chunk ", "of ", "data ", "\n"}
	var b []byte
	for len(b) < n {
		b = append(b, words[r.IntN(len(words))]...)
	}
	return b[:n]
}

// tokenCase builds a token stream of nTok tokens whose second half is random (so some
// zstd chunks do not shrink and are stored raw).
func tokenCase(name string, dtype string, seqLen, nTok int, opts WriterOptions) testCase {
	r := rand.New(rand.NewPCG(1, uint64(nTok)))
	ts := 2
	if dtype == "uint32" {
		ts = 4
	}
	txt := textish(r, nTok)
	stream := make([]byte, nTok*ts)
	for i := range nTok {
		v := uint32(txt[i])
		if i > nTok/2 {
			v = r.Uint32N(60000)
		}
		if ts == 2 {
			binary.LittleEndian.PutUint16(stream[2*i:], uint16(v))
		} else {
			binary.LittleEndian.PutUint32(stream[4*i:], v|uint32(i%3)<<16)
		}
	}
	opts.Schema = Schema{Kind: KindTokens, TokenDType: dtype, SeqLen: seqLen}
	tc := testCase{name: name, opts: opts}
	for i := 0; (i*seqLen+seqLen+1)*ts <= len(stream); i++ {
		tc.expect = append(tc.expect, stream[i*seqLen*ts:(i*seqLen+seqLen+1)*ts])
	}
	tc.feed = func(t testing.TB, w *Writer) {
		// Irregular pieces, splitting tokens across calls.
		for p := stream; len(p) > 0; {
			n := min(len(p), 1+r.IntN(3000))
			if _, err := w.Write(p[:n]); err != nil {
				t.Fatal(err)
			}
			p = p[n:]
		}
	}
	return tc
}

func recordCase(name string, features, n int, opts WriterOptions) testCase {
	r := rand.New(rand.NewPCG(2, uint64(n)))
	opts.Schema = Schema{Kind: KindRecords, FeatureDType: "float32", Features: features, LabelDType: "int32"}
	ss := opts.Schema.SampleSize()
	tc := testCase{name: name, opts: opts}
	var all []byte
	for i := range n {
		rec := make([]byte, ss)
		for f := range features {
			binary.LittleEndian.PutUint32(rec[4*f:], uint32(r.IntN(8))<<20)
		}
		binary.LittleEndian.PutUint32(rec[4*features:], uint32(i))
		tc.expect = append(tc.expect, rec)
		all = append(all, rec...)
	}
	tc.feed = func(t testing.TB, w *Writer) {
		half := len(tc.expect) / 2
		for _, rec := range tc.expect[:half] {
			if err := w.AppendRecord(rec); err != nil {
				t.Fatal(err)
			}
		}
		// The rest as an unaligned byte stream.
		for p := all[half*ss:]; len(p) > 0; {
			k := min(len(p), 1+r.IntN(700))
			if _, err := w.Write(p[:k]); err != nil {
				t.Fatal(err)
			}
			p = p[k:]
		}
	}
	return tc
}

func bytesCase(name string, n int, opts WriterOptions) testCase {
	r := rand.New(rand.NewPCG(3, uint64(n)))
	opts.Schema = Schema{Kind: KindBytes}
	tc := testCase{name: name, opts: opts}
	for i := range n {
		var rec []byte
		switch i % 7 {
		case 3:
			rec = []byte{} // empty records are allowed
		case 5:
			rec = textish(r, 3*opts.ChunkSize+r.IntN(100)) // spans several chunks
		default:
			rec = textish(r, r.IntN(300))
		}
		tc.expect = append(tc.expect, rec)
	}
	tc.feed = func(t testing.TB, w *Writer) {
		for _, rec := range tc.expect {
			if err := w.AppendRecord(rec); err != nil {
				t.Fatal(err)
			}
		}
	}
	return tc
}

// allCases covers every kind with both compressions, with small chunks and shards.
func allCases() []testCase {
	var cs []testCase
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		o := WriterOptions{ChunkSize: 1000, ShardSize: 5000, Compression: comp, Workers: 3}
		cs = append(cs,
			tokenCase("tokens16/"+string(comp), "uint16", 37, 9000, o),
			tokenCase("tokens32/"+string(comp), "uint32", 64, 5000, o),
			tokenCase("tokens16-exact/"+string(comp), "uint16", 10, 2*((5000/2-1)/10*10)+1, o),
			recordCase("records/"+string(comp), 13, 700, o),
			bytesCase("bytes/"+string(comp), 120, o),
		)
	}
	return cs
}

func writeCase(t testing.TB, dir string, tc testCase) *Manifest {
	t.Helper()
	ctx := context.Background()
	w, err := Create(ctx, dir, tc.opts)
	if err != nil {
		t.Fatal(err)
	}
	tc.feed(t, w)
	m, err := w.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func checkSamples(t testing.TB, d *Dataset, expect [][]byte) {
	t.Helper()
	if d.Len() != int64(len(expect)) {
		t.Fatalf("Len = %d, want %d", d.Len(), len(expect))
	}
	var dst []byte
	for i, want := range expect {
		got, err := d.Sample(int64(i), dst)
		if err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("sample %d: got %d bytes %x..., want %d bytes %x...", i, len(got), got[:min(8, len(got))], len(want), want[:min(8, len(want))])
		}
		if d.compressed {
			dst = got
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range allCases() {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ds")
			m := writeCase(t, dir, tc)
			if len(m.Shards) < 2 {
				t.Errorf("%d shards, want several (small ShardSize)", len(m.Shards))
			}
			if m.Shards[0].Chunks < 3 {
				t.Errorf("%d chunks in shard 0, want several (small ChunkSize)", m.Shards[0].Chunks)
			}
			if tc.opts.Compression == CompressionZstd && m.StoredBytes >= m.RawBytes {
				t.Errorf("zstd stored %d bytes for %d raw", m.StoredBytes, m.RawBytes)
			}
			d, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if d.Schema().Kind != tc.opts.Schema.Kind || d.SampleSize() != tc.opts.Schema.SampleSize() {
				t.Errorf("schema %+v / sample size %d do not match", d.Schema(), d.SampleSize())
			}
			checkSamples(t, d, tc.expect)
			var last int64
			if err := d.Verify(context.Background(), func(done, total int64) { last = done }); err != nil {
				t.Fatal(err)
			}
			if last != m.StoredBytes {
				t.Errorf("progress ended at %d, want %d", last, m.StoredBytes)
			}
			d.Advise(0, d.Len())
			if _, err := d.Sample(d.Len(), nil); err == nil {
				t.Error("Sample(Len) succeeded")
			}
			// No temp dir left next to the dataset.
			ents, _ := os.ReadDir(filepath.Dir(dir))
			if len(ents) != 1 {
				t.Errorf("parent holds %d entries, want only the dataset", len(ents))
			}
		})
	}
}
