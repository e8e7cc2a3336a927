package dataset

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// seedShards writes a small dataset of every kind and compression and returns its shard
// files, for fuzz seeds and parser tests.
func seedShards(tb testing.TB) [][]byte {
	var out [][]byte
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		o := WriterOptions{ChunkSize: 200, ShardSize: 1500, Compression: comp, Workers: 1}
		for _, tc := range []testCase{
			tokenCase("t", "uint16", 9, 1200, o),
			tokenCase("t32", "uint32", 5, 400, o),
			recordCase("r", 3, 120, o),
			bytesCase("b", 20, WriterOptions{ChunkSize: 64, ShardSize: 1500, Compression: comp, Workers: 1}),
		} {
			dir := filepath.Join(tb.TempDir(), "ds")
			m := writeCase(tb, dir, tc)
			for _, s := range m.Shards[:min(2, len(m.Shards))] {
				b, err := os.ReadFile(filepath.Join(dir, s.Name))
				if err != nil {
					tb.Fatal(err)
				}
				out = append(out, b)
			}
		}
	}
	return out
}

// readAll parses b as a shard and, when that succeeds, reads every chunk and up to 500
// samples through the real Sample path. It must never panic.
func readAll(b []byte) error {
	l, err := parseShard(b)
	if err != nil {
		return err
	}
	if l.hdr.ChunkSize > 1<<20 {
		return nil // valid but too slow to decode in a fuzz loop
	}
	s := &shard{path: "fuzz.spl", m: b, l: l, verified: make([]atomic.Uint64, (len(l.chunks)+63)/64)}
	d := &Dataset{man: &Manifest{Samples: int64(l.trl.Samples)}, sampleSize: int(l.hdr.SampleSize),
		compressed: l.hdr.Compression == codeZstd, shards: []*shard{s}, firsts: []int64{0},
		cache: newChunkCache(2)}
	var firstErr error
	for c := range l.chunks {
		if _, err := s.decodeChunk(c, nil); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	var dst []byte
	for i := int64(0); i < min(d.Len(), 500); i++ {
		got, err := d.Sample(i, dst)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if d.sampleSize > 0 && len(got) != d.sampleSize {
			panic("sample of wrong size")
		}
		if d.compressed {
			dst = got
		}
	}
	d.Advise(0, d.Len())
	return firstErr
}

func TestParseShardSeeds(t *testing.T) {
	for i, b := range seedShards(t) {
		if err := readAll(b); err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
		// Every truncation is rejected, as truncated or malformed.
		for _, n := range []int{0, 10, headerSize, len(b) - trailerSize, len(b) - 1} {
			if _, err := parseShard(b[:n]); !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrFormat) {
				t.Fatalf("seed %d cut to %d bytes: %v", i, n, err)
			}
		}
		// A flipped bit in the header or index is caught by Open-time checks.
		for _, off := range []int{3, 20, 40, len(b) - trailerSize - 1, len(b) - 30} {
			c := append([]byte(nil), b...)
			c[off] ^= 1
			if _, err := parseShard(c); err == nil {
				t.Fatalf("seed %d: flipped byte %d accepted", i, off)
			}
		}
	}
}

func FuzzParseShard(f *testing.F) {
	for _, b := range seedShards(f) {
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add(make([]byte, headerSize+trailerSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		readAll(b) // must not panic; errors are expected
	})
}

func FuzzManifest(f *testing.F) {
	dir := filepath.Join(f.TempDir(), "ds")
	writeCase(f, dir, bytesCase("b", 30, WriterOptions{ChunkSize: 64, ShardSize: 500}))
	good, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"format":"spill-dataset","format_version":1,"schema":{"kind":"tokens","token_dtype":"uint16","seq_len":4},"compression":"none","chunk_size":8,"samples":1,"shards":[{"name":"a","size":5000,"samples":1}]}`))
	f.Add([]byte(`{"format":"spill-dataset","format_version":1,"shards":[{"name":"../x"}]}`))
	f.Add([]byte("["))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest("manifest.json", data)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		// A manifest that parses survives a round trip.
		again, err := marshalManifest(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseManifest("again.json", again); err != nil {
			t.Fatalf("re-encoded manifest rejected: %v", err)
		}
	})
}

func TestManifestValidOpens(t *testing.T) {
	// ParseManifest accepts what the writer writes, and Open agrees with it.
	dir := filepath.Join(t.TempDir(), "ds")
	m := writeCase(t, dir, recordCase("r", 2, 50, WriterOptions{ChunkSize: 64, ShardSize: 300}))
	got, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Samples != m.Samples || len(got.Shards) != len(m.Shards) || got.Shards[1] != m.Shards[1] {
		t.Fatalf("read back %+v, wrote %+v", got, m)
	}
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Manifest().StoredBytes != m.StoredBytes {
		t.Fatal("Open's manifest differs")
	}
}
