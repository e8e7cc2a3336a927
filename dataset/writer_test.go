package dataset

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestAbortLeavesNothing(t *testing.T) {
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		parent := t.TempDir()
		tc := tokenCase("t", "uint16", 20, 20000, WriterOptions{ChunkSize: 512, ShardSize: 4096, Compression: comp})
		w, err := Create(context.Background(), filepath.Join(parent, "ds"), tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		tc.feed(t, w)
		if len(dirEntries(t, parent)) != 1 {
			t.Fatalf("want one temp dir while writing, have %v", dirEntries(t, parent))
		}
		if err := w.Abort(); err != nil {
			t.Fatal(err)
		}
		if err := w.Abort(); err != nil {
			t.Fatalf("second Abort: %v", err)
		}
		if got := dirEntries(t, parent); len(got) != 0 {
			t.Fatalf("after Abort the parent holds %v", got)
		}
		if _, err := w.Write([]byte{1, 2}); err == nil {
			t.Fatal("Write after Abort succeeded")
		}
		if _, err := w.Commit(context.Background()); err == nil {
			t.Fatal("Commit after Abort succeeded")
		}
	}
}

func TestCommitErrorsLeaveNothing(t *testing.T) {
	parent := t.TempDir()
	ctx := context.Background()
	opts := WriterOptions{Schema: Schema{Kind: KindRecords, FeatureDType: "int32", Features: 3, LabelDType: "int32"}}
	w, err := Create(ctx, filepath.Join(parent, "ds"), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AppendRecord(make([]byte, 15)); err == nil {
		t.Fatal("AppendRecord accepted a 15-byte record for a 16-byte schema")
	}
	w.Write(make([]byte, 16*5+3)) // a partial record at the end
	if _, err := w.Commit(ctx); err == nil || !strings.Contains(err.Error(), "whole number") {
		t.Fatalf("Commit of a partial record: %v", err)
	}
	if got := dirEntries(t, parent); len(got) != 0 {
		t.Fatalf("after a failed Commit the parent holds %v", got)
	}

	// A cancelled context fails Commit and cleans up.
	cctx, cancel := context.WithCancel(ctx)
	w, err = Create(cctx, filepath.Join(parent, "ds"), opts)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(make([]byte, 16*100))
	cancel()
	w.Write(make([]byte, 16*100))
	if _, err := w.Commit(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Commit after cancel: %v, want context.Canceled", err)
	}
	if got := dirEntries(t, parent); len(got) != 0 {
		t.Fatalf("after a cancelled write the parent holds %v", got)
	}
}

func TestCreateTarget(t *testing.T) {
	parent := t.TempDir()
	ctx := context.Background()
	opts := WriterOptions{Schema: Schema{Kind: KindBytes}}
	full := filepath.Join(parent, "full")
	os.MkdirAll(full, 0o755)
	os.WriteFile(filepath.Join(full, "x"), nil, 0o644)
	if _, err := Create(ctx, full, opts); err == nil {
		t.Fatal("Create into a non-empty directory succeeded")
	}
	empty := filepath.Join(parent, "empty")
	os.Mkdir(empty, 0o755)
	w, err := Create(ctx, empty, opts)
	if err != nil {
		t.Fatal(err)
	}
	m, err := w.Commit(ctx)
	if err != nil {
		t.Fatalf("Commit into an existing empty directory: %v", err)
	}
	if m.Samples != 0 || len(m.Shards) != 0 {
		t.Fatalf("empty dataset manifest: %+v", m)
	}
	d, err := Open(empty)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Len() != 0 || d.Verify(ctx, nil) != nil {
		t.Fatal("empty dataset does not open as empty")
	}
	if _, err := d.Sample(0, nil); err == nil {
		t.Fatal("Sample(0) of an empty dataset succeeded")
	}

	bad := WriterOptions{Schema: Schema{Kind: KindTokens, TokenDType: "int8"}, ChunkSize: 1, Compression: "lz4", Level: 9}
	err = bad.Validate()
	for _, want := range []string{"token_dtype", "seq_len", "chunk size", "compression", "level"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error %v does not mention %s", err, want)
		}
	}
}

// TestTokenShardBoundary checks the boundary rule: every shard after the first starts with
// the last token of the previous one, windows never straddle shards, and Manifest.Tokens
// counts each token once.
func TestTokenShardBoundary(t *testing.T) {
	const seqLen, nTok = 16, 3001
	opts := WriterOptions{ChunkSize: 100, ShardSize: 500}
	tc := tokenCase("t", "uint16", seqLen, nTok, opts)
	dir := filepath.Join(t.TempDir(), "ds")
	m := writeCase(t, dir, tc)
	if m.Tokens != nTok || m.Samples != (nTok-1)/seqLen {
		t.Fatalf("tokens %d samples %d, want %d and %d", m.Tokens, m.Samples, nTok, (nTok-1)/seqLen)
	}
	var prevLast uint16
	for k, s := range m.Shards {
		b, err := os.ReadFile(filepath.Join(dir, s.Name))
		if err != nil {
			t.Fatal(err)
		}
		l, _ := parseShard(b)
		raw := b[headerSize : headerSize+l.trl.RawBytes] // uncompressed: raw == stored
		first := binary.LittleEndian.Uint16(raw)
		if k > 0 && first != prevLast {
			t.Fatalf("shard %d starts with token %d, previous shard ends with %d", k, first, prevLast)
		}
		if k < len(m.Shards)-1 && int64(len(raw)) != (s.Samples*seqLen+1)*2 {
			t.Fatalf("shard %d holds %d bytes for %d windows", k, len(raw), s.Samples)
		}
		prevLast = binary.LittleEndian.Uint16(raw[len(raw)-2:])
	}
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	checkSamples(t, d, tc.expect)
}

func TestTokenTailDropped(t *testing.T) {
	// 2 shards of exactly 3 windows, then 5 more tokens: not enough for a window, so the
	// third shard (the repeated token + 5) is dropped.
	const seqLen = 8
	opts := WriterOptions{Schema: Schema{Kind: KindTokens, TokenDType: "uint16", SeqLen: seqLen}, ShardSize: (3*seqLen + 1) * 2}
	dir := filepath.Join(t.TempDir(), "ds")
	w, err := Create(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	n := 2*3*seqLen + 1 + 5
	w.Write(make([]byte, 2*n))
	m, err := w.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Shards) != 2 || m.Samples != 6 || m.Tokens != int64(n-5) {
		t.Fatalf("shards %d samples %d tokens %d; want 2, 6, %d", len(m.Shards), m.Samples, m.Tokens, n-5)
	}
	if got := dirEntries(t, dir); len(got) != 3 {
		t.Fatalf("dataset dir holds %v, want manifest and 2 shards", got)
	}
}

func TestWriterStats(t *testing.T) {
	tc := recordCase("r", 4, 500, WriterOptions{ChunkSize: 256, ShardSize: 2000, Compression: CompressionZstd})
	w, err := Create(context.Background(), filepath.Join(t.TempDir(), "ds"), tc.opts)
	if err != nil {
		t.Fatal(err)
	}
	tc.feed(t, w)
	m, err := w.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	if st.BytesIn != m.RawBytes || st.BytesStored != m.StoredBytes || st.Samples != 500 || st.Shards != len(m.Shards) {
		t.Fatalf("stats %+v disagree with manifest (raw %d stored %d shards %d)", st, m.RawBytes, m.StoredBytes, len(m.Shards))
	}
}
