package dataset

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// smallCase writes a multi-shard tokens dataset and returns its dir, manifest and samples.
func smallCase(t *testing.T, comp Compression) (string, *Manifest, testCase) {
	t.Helper()
	tc := tokenCase("tokens", "uint16", 50, 12000, WriterOptions{ChunkSize: 1024, ShardSize: 6000, Compression: comp, Workers: 2})
	dir := filepath.Join(t.TempDir(), "ds")
	m := writeCase(t, dir, tc)
	if len(m.Shards) < 3 || m.Shards[1].Chunks < 4 {
		t.Fatalf("want >= 3 shards with >= 4 chunks, got %d shards, %d chunks", len(m.Shards), m.Shards[1].Chunks)
	}
	return dir, m, tc
}

func layoutOf(t *testing.T, path string) *shardLayout {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := parseShard(b)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func wantShardErr(t *testing.T, err error, shard string, chunk int, sentinel error) {
	t.Helper()
	var se *ShardError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not a *ShardError", err, err)
	}
	if filepath.Base(se.Shard) != shard || se.Chunk != chunk {
		t.Fatalf("error names shard %s chunk %d, want %s chunk %d: %v", se.Shard, se.Chunk, shard, chunk, err)
	}
	if sentinel != nil && !errors.Is(err, sentinel) {
		t.Fatalf("error %v does not wrap %v", err, sentinel)
	}
	if !strings.Contains(err.Error(), shard) {
		t.Fatalf("message %q does not name %s", err, shard)
	}
	wantOnePrefix(t, err)
}

// wantOnePrefix fails unless err's message is one line with the package prefix once, no
// sentinel text repeated, and (when it names a path) the path once.
func wantOnePrefix(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	if n := strings.Count(msg, "dataset:"); n != 1 || !strings.HasPrefix(msg, "dataset: ") {
		t.Errorf("message %q: want one leading \"dataset: \" prefix, have %d", msg, n)
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("message %q spans lines", msg)
	}
	for _, s := range []string{"bad format", "checksum mismatch", "truncated file"} {
		if strings.Count(msg, s) > 1 {
			t.Errorf("message %q repeats %q", msg, s)
		}
	}
	var se *ShardError
	if errors.As(err, &se) && strings.Count(msg, se.Shard) != 1 {
		t.Errorf("message %q: want the shard path %s once", msg, se.Shard)
	}
}

func TestCorruptChunk(t *testing.T) {
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		t.Run(string(comp), func(t *testing.T) {
			dir, m, tc := smallCase(t, comp)
			name := m.Shards[1].Name
			path := filepath.Join(dir, name)
			l := layoutOf(t, path)
			const bad = 2
			e := l.chunks[bad]
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			off := int64(e.Offset) + int64(e.StoredLen)/2
			f.ReadAt(b[:], off)
			b[0] ^= 0x40
			f.WriteAt(b[:], off)
			f.Close()

			d, err := Open(dir)
			if err != nil {
				t.Fatalf("Open reads no chunk data and should succeed: %v", err)
			}
			defer d.Close()
			wantShardErr(t, d.Verify(context.Background(), nil), name, bad, ErrChecksum)

			// Samples touching the chunk fail every time; others still work.
			cs := int64(l.hdr.ChunkSize)
			var touched, clean int
			for j := int64(0); j < m.Shards[1].Samples; j++ {
				a := j * int64(l.hdr.Stride)
				b := a + int64(l.hdr.SampleSize)
				i := m.Shards[1].FirstSample + j
				got, err := d.Sample(i, nil)
				if a/cs <= bad && (b-1)/cs >= bad {
					touched++
					wantShardErr(t, err, name, bad, ErrChecksum)
					_, err2 := d.Sample(i, nil)
					wantShardErr(t, err2, name, bad, ErrChecksum)
				} else {
					clean++
					if err != nil || string(got) != string(tc.expect[i]) {
						t.Fatalf("sample %d away from the bad chunk: %v", i, err)
					}
				}
			}
			if touched == 0 || clean == 0 {
				t.Fatalf("touched %d, clean %d samples: test does not cover both", touched, clean)
			}
		})
	}
}

func TestCorruptPaddingCaughtByFileCRC(t *testing.T) {
	dir, m, _ := smallCase(t, CompressionNone)
	path := filepath.Join(dir, m.Shards[0].Name)
	f, _ := os.OpenFile(path, os.O_RDWR, 0)
	f.WriteAt([]byte{1}, 1000) // header padding: no field, no chunk
	f.Close()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	wantShardErr(t, d.Verify(context.Background(), nil), m.Shards[0].Name, -1, ErrChecksum)
}

func TestOpenBadShards(t *testing.T) {
	cases := []struct {
		name     string
		damage   func(t *testing.T, dir string, m *Manifest)
		sentinel error
		notExist bool
		shard    int // index of the shard the error must name (0 means 1, -1 means 0)
	}{
		{"truncated", func(t *testing.T, dir string, m *Manifest) {
			os.Truncate(filepath.Join(dir, m.Shards[1].Name), m.Shards[1].Size-100)
		}, ErrTruncated, false, 0},
		{"truncated-manifest-agrees", func(t *testing.T, dir string, m *Manifest) {
			os.Truncate(filepath.Join(dir, m.Shards[1].Name), m.Shards[1].Size-100)
			m.Shards[1].Size -= 100
			rewriteManifest(t, dir, m)
		}, ErrTruncated, false, 0},
		{"cut-to-header", func(t *testing.T, dir string, m *Manifest) {
			os.Truncate(filepath.Join(dir, m.Shards[1].Name), 10)
		}, ErrTruncated, false, 0},
		{"longer", func(t *testing.T, dir string, m *Manifest) {
			f, _ := os.OpenFile(filepath.Join(dir, m.Shards[1].Name), os.O_WRONLY|os.O_APPEND, 0)
			f.Write([]byte("junk"))
			f.Close()
		}, ErrFormat, false, 0},
		{"bad-magic", func(t *testing.T, dir string, m *Manifest) {
			f, _ := os.OpenFile(filepath.Join(dir, m.Shards[1].Name), os.O_WRONLY, 0)
			f.WriteAt([]byte("NOTSPILL"), 0)
			f.Close()
		}, ErrFormat, false, 0},
		{"manifest-samples", func(t *testing.T, dir string, m *Manifest) {
			m.Shards[1].Samples++
			m.Shards[2].FirstSample++
			m.Samples++
			for i := 3; i < len(m.Shards); i++ {
				m.Shards[i].FirstSample++
			}
			rewriteManifest(t, dir, m)
		}, ErrFormat, false, 0},
		{"manifest-chunk-size", func(t *testing.T, dir string, m *Manifest) {
			m.ChunkSize *= 2
			rewriteManifest(t, dir, m)
		}, ErrFormat, false, -1},
		{"missing", func(t *testing.T, dir string, m *Manifest) {
			os.Remove(filepath.Join(dir, m.Shards[1].Name))
		}, nil, true, 0},
		{"swapped", func(t *testing.T, dir string, m *Manifest) {
			a, b := filepath.Join(dir, m.Shards[1].Name), filepath.Join(dir, m.Shards[2].Name)
			os.Rename(a, a+".x")
			os.Rename(b, a)
			os.Rename(a+".x", b)
			m.Shards[1].Size, m.Shards[2].Size = m.Shards[2].Size, m.Shards[1].Size
			rewriteManifest(t, dir, m)
		}, ErrFormat, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, m, _ := smallCase(t, CompressionNone)
			c.damage(t, dir, m)
			d, err := Open(dir)
			if err == nil {
				d.Close()
				t.Fatal("Open succeeded on a damaged dataset")
			}
			k := 1
			if c.shard < 0 {
				k = 0
			}
			wantShardErr(t, err, m.Shards[k].Name, -1, c.sentinel)
			if c.notExist && !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("missing shard: %v does not wrap fs.ErrNotExist", err)
			}
		})
	}
}

func rewriteManifest(t *testing.T, dir string, m *Manifest) {
	t.Helper()
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestName), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBadManifest(t *testing.T) {
	dir, m, _ := smallCase(t, CompressionNone)
	path := filepath.Join(dir, ManifestName)
	good, _ := os.ReadFile(path)
	cases := map[string]struct {
		data string
		want string
	}{
		"syntax":      {strings.Replace(string(good), `"samples"`, `"samples`, 1), "manifest.json:"},
		"not-object":  {"[1,2]", "bad manifest JSON"},
		"empty":       {"", "bad manifest JSON"},
		"version":     {strings.Replace(string(good), `"format_version": 1`, `"format_version": 99`, 1), "format_version 99"},
		"path-escape": {strings.Replace(string(good), m.Shards[0].Name, "../evil", 1), `bad file name "../evil"`},
		"total":       {strings.Replace(string(good), `"raw_bytes": `, `"raw_bytes": 1`, 1), "raw"},
		"schema":      {strings.Replace(string(good), `"seq_len": 50`, `"seq_len": 0`, 1), "invalid schema: seq_len 0"},
		"trailing":    {string(good) + "{}", "trailing data"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			os.WriteFile(path, []byte(c.data), 0o644)
			d, err := Open(dir)
			if err == nil {
				d.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), ManifestName) {
				t.Fatalf("error %q: want ErrFormat naming %s and containing %q", err, ManifestName, c.want)
			}
			wantOnePrefix(t, err)
		})
	}
	os.Remove(path)
	_, err := Open(dir)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing manifest: %v", err)
	}
	wantOnePrefix(t, err)
}

func TestConcurrentSample(t *testing.T) {
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		t.Run(string(comp), func(t *testing.T) {
			dir, _, tc := smallCase(t, comp)
			d, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var dst []byte
					for k := range 400 {
						i := int64((k*7919 + g*104729) % len(tc.expect))
						got, err := d.Sample(i, dst)
						if err != nil {
							errs <- err
							return
						}
						if string(got) != string(tc.expect[i]) {
							errs <- errors.New("wrong sample bytes under concurrency")
							return
						}
						if comp == CompressionZstd {
							dst = got
						}
						if k%100 == 0 {
							d.Advise(i, i+10)
						}
					}
				}()
			}
			wg.Add(1)
			go func() { defer wg.Done(); errs <- d.Verify(context.Background(), nil) }()
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
