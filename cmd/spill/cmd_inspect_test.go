package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// makeDataset converts 20001 tokens into a dataset of several shards and returns its dir.
func makeDataset(t *testing.T, compress string) string {
	t.Helper()
	in := writeTokens(t, t.TempDir(), 20_001)
	out := filepath.Join(t.TempDir(), "ds")
	if code, _, stderr := run(t, context.Background(), "convert", "--quiet", "--out", out, "--seq-len", "100",
		"--shard-size", "10KiB", "--chunk-size", "2KiB", "--compress", compress, in); code != exitOK {
		t.Fatalf("convert: exit %d: %s", code, stderr)
	}
	return out
}

func TestInspectText(t *testing.T) {
	dir := makeDataset(t, "zstd")
	code, stdout, stderr := run(t, context.Background(), "inspect", dir, "--verify")
	if code != exitOK {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"tokens uint16, seq_len 100 (101 tokens, 202 bytes per sample)",
		"samples      200 (20001 tokens)",
		"compression  zstd",
		"shard-00000.spl", "shard-00003.spl",
		"compression ratio",
		"verify       ok",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, stdout)
		}
	}
}

func TestInspectJSON(t *testing.T) {
	dir := makeDataset(t, "none")
	code, stdout, stderr := run(t, context.Background(), "inspect", "--json", dir, "--verify")
	if code != exitOK {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	var rep inspectReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, stdout)
	}
	var samples, raw int64
	for _, s := range rep.Shards {
		samples += s.Samples
		raw += s.RawBytes
		if s.Ratio != 1 {
			t.Errorf("uncompressed shard %s ratio %v", s.Name, s.Ratio)
		}
	}
	if rep.Samples != 200 || samples != 200 || raw != rep.RawBytes || rep.Tokens != 20001 || len(rep.Shards) < 4 ||
		rep.Verify == nil || !rep.Verify.OK || rep.Schema.SeqLen != 100 || rep.FileBytes <= rep.StoredBytes {
		t.Fatalf("report %+v", rep)
	}
}

// flipByte corrupts one byte of file at off.
func flipByte(t *testing.T, file string, off int64) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestInspectVerifyCorrupted(t *testing.T) {
	for _, compress := range []string{"none", "zstd"} {
		t.Run(compress, func(t *testing.T) {
			dir := makeDataset(t, compress)
			// Second chunk of the second shard (data starts after the 4 KiB header).
			var rep inspectReport
			_, stdout, _ := run(t, context.Background(), "inspect", "--json", dir)
			if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
				t.Fatal(err)
			}
			off := int64(4096) + rep.Shards[1].StoredBytes*3/4
			flipByte(t, filepath.Join(dir, "shard-00001.spl"), off)
			// Without --verify the header and footer are fine.
			if code, _, stderr := run(t, context.Background(), "inspect", dir); code != exitOK {
				t.Fatalf("inspect without --verify: exit %d: %s", code, stderr)
			}
			code, stdout, stderr := run(t, context.Background(), "inspect", dir, "--verify")
			if code != exitFailure || !strings.Contains(stderr, "shard-00001.spl chunk") || !strings.Contains(stdout, "verify       FAILED") {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 naming shard-00001.spl and a chunk", code, stdout, stderr)
			}
			code, stdout, _ = run(t, context.Background(), "inspect", dir, "--verify", "--json")
			if code != exitFailure || !strings.Contains(stdout, `"ok": false`) {
				t.Fatalf("--json: exit %d, stdout %s", code, stdout)
			}
		})
	}
}

func TestInspectBrokenDataset(t *testing.T) {
	t.Run("missing-shard-file", func(t *testing.T) {
		dir := makeDataset(t, "none")
		os.Remove(filepath.Join(dir, "shard-00002.spl"))
		code, _, stderr := run(t, context.Background(), "inspect", dir)
		if code != exitFailure || !strings.Contains(stderr, "shard-00002.spl") {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("missing-manifest-entry", func(t *testing.T) {
		dir := makeDataset(t, "none")
		mp := filepath.Join(dir, "manifest.json")
		data, _ := os.ReadFile(mp)
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		shards := m["shards"].([]any)
		m["shards"] = append(shards[:1], shards[2:]...) // drop shard-00001's entry
		data, _ = json.Marshal(m)
		os.WriteFile(mp, data, 0o644)
		code, _, stderr := run(t, context.Background(), "inspect", dir)
		if code != exitFailure || !strings.Contains(stderr, "manifest") {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("missing-manifest", func(t *testing.T) {
		dir := makeDataset(t, "none")
		os.Remove(filepath.Join(dir, "manifest.json"))
		code, _, stderr := run(t, context.Background(), "inspect", dir)
		if code != exitFailure || !strings.Contains(stderr, "manifest.json") {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
	if code, _, _ := run(t, context.Background(), "inspect"); code != exitUsage {
		t.Errorf("inspect without a directory: exit %d, want %d", code, exitUsage)
	}
	if code, _, _ := run(t, context.Background(), "inspect", "a", "b"); code != exitUsage {
		t.Errorf("inspect with two directories: exit %d, want %d", code, exitUsage)
	}
}

func TestInspectVerifyInterrupted(t *testing.T) {
	dir := makeDataset(t, "none")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if code, _, _ := run(t, ctx, "inspect", "--verify", dir); code != exitInterrupted {
		t.Fatalf("exit %d, want %d", code, exitInterrupted)
	}
}
