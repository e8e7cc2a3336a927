package engine

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestExportCheckpointStreams: ExportCheckpoint writes the same bytes as
// Export and ExportHF of the weights LoadCheckpoint reads (nanoGPT, one
// HF file, sharded HF), and the Go heap it allocates is bounded by the
// largest tensor plus a constant, not by the checkpoint's size.
func TestExportCheckpointStreams(t *testing.T) {
	const L, C, V, T = 6, 256, 1024, 64 // tensors up to 1 MiB, ~19 MiB of weights
	ws := fakeGPTWeights(L, C, V, T)
	cfg := DefaultConfig()
	cfg.Layers, cfg.Heads, cfg.Embd, cfg.Vocab, cfg.MaxSeq = L, 4, C, V, T
	var largest, total int64
	var optim []NamedTensor
	for _, w := range ws {
		largest = max(largest, int64(len(w.Data)))
		total += int64(len(w.Data))
		for _, s := range []string{".exp_avg", ".exp_avg_sq"} {
			optim = append(optim, NamedTensor{Name: w.Name + s, DType: w.DType, Shape: w.Shape, Data: w.Data})
		}
	}
	root := t.TempDir()
	ckpt, err := SaveCheckpoint(filepath.Join(root, "ckpt"), &Checkpoint{State: TrainState{Step: 3, Config: cfg}, Weights: ws, Optim: optim}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ws, optim = nil, nil

	// A constant for the headers, JSON and I/O buffers (1 MiB for the
	// HF writer, 256 KiB each for the hash, the nanoGPT writer and the
	// transpose), with room to spare.
	const slack = 4 << 20
	for _, c := range []struct {
		name, format string
		shard        int64
	}{{"nanogpt", FormatNanoGPT, 0}, {"hf", FormatHF, 0}, {"hf-sharded", FormatHF, 4 << 20}} {
		t.Run(c.name, func(t *testing.T) {
			o := HFExportOptions{ShardSize: c.shard}
			got := filepath.Join(root, c.name+"-stream")
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			st, err := ExportCheckpoint(ckpt, got, c.format, o)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			if st.Step != 3 {
				t.Errorf("step %d, want 3", st.Step)
			}
			alloc := int64(after.TotalAlloc - before.TotalAlloc)
			t.Logf("allocated %d bytes; largest tensor %d, weights %d", alloc, largest, total)
			if alloc > largest+slack {
				t.Errorf("export allocated %d bytes, want at most the largest tensor %d + %d (the weights are %d)", alloc, largest, slack, total)
			}

			// The old path: the whole checkpoint in memory.
			ck, err := LoadCheckpoint(ckpt)
			if err != nil {
				t.Fatal(err)
			}
			want := filepath.Join(root, c.name+"-load")
			if c.format == FormatHF {
				err = ExportHF(ck.Weights, ck.State.Config, want, o)
			} else {
				err = Export(ck.Weights, ck.State.Config, want, c.format)
			}
			if err != nil {
				t.Fatal(err)
			}
			files := []string{""}
			if c.format == FormatHF {
				ents, _ := os.ReadDir(want)
				files = files[:0]
				for _, e := range ents {
					files = append(files, e.Name())
				}
				if gotEnts, _ := os.ReadDir(got); len(gotEnts) != len(ents) {
					t.Errorf("%d files, the in-memory export %d", len(gotEnts), len(ents))
				}
				if c.shard > 0 && len(files) < 4 {
					t.Errorf("sharded export has only %v", files)
				}
			}
			for _, f := range files {
				a, err := os.ReadFile(filepath.Join(got, f))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := os.ReadFile(filepath.Join(want, f))
				if !bytes.Equal(a, b) {
					t.Errorf("%s: the streamed export differs from the in-memory one (%d vs %d bytes)", filepath.Join(got, f), len(a), len(b))
				}
			}
		})
	}

	// A corrupted optimizer file is refused as LoadCheckpoint refuses it,
	// and nothing is written.
	optimFile := filepath.Join(ckpt, CheckpointOptimFile)
	data, _ := os.ReadFile(optimFile)
	data[len(data)-1] ^= 1
	os.WriteFile(optimFile, data, 0o644)
	out := filepath.Join(root, "corrupt")
	if _, err := ExportCheckpoint(ckpt, out, FormatHF, HFExportOptions{}); err == nil || !bytes.Contains([]byte(err.Error()), []byte(optimFile)) {
		t.Errorf("corrupt optimizer file: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("output left from a corrupt checkpoint: %v", err)
	}
}

// TestWriteTransposedF32: the buffered transpose equals the plain one
// for matrices whose transposed rows fit the buffer and for ones that
// do not.
func TestWriteTransposedF32(t *testing.T) {
	for _, s := range [][2]int{{3, 5}, {1, 7}, {7, 1}, {transposeBuf/4 + 3, 2}, {2*transposeBuf/4 + 1, 3}, {300, 260}} {
		rows, cols := s[0], s[1]
		src := make([]byte, 4*rows*cols)
		for i := range src {
			src[i] = byte(i*7 + i/251)
		}
		want := make([]byte, len(src))
		for r := 0; r < rows; r++ {
			for c := 0; c < cols; c++ {
				copy(want[4*(c*rows+r):4*(c*rows+r)+4], src[4*(r*cols+c):])
			}
		}
		var got bytes.Buffer
		var buf []byte
		if err := writeTransposedF32(&got, src, rows, cols, &buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) || len(buf) > transposeBuf {
			t.Errorf("%dx%d: transpose differs (buffer %d bytes)", rows, cols, len(buf))
		}
	}
}
