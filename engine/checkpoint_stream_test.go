package engine

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// allocated is the Go memory fn allocates (runtime.MemStats.TotalAlloc:
// every allocation, whether freed since or not).
func allocated(fn func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	fn()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc
}

// TestCheckpointStreamsSplitModel: a model whose optimizer state is split
// across device, host and disk (in bf16 with the disk layers' master on
// disk too) is saved tensor by tensor from each tier and restored tensor
// by tensor into a fresh trainer, each with at most the largest tensor
// and the files' I/O buffers of extra memory (the whole checkpoint
// is several times that), and the restored run continues bit for bit as
// the uninterrupted one.
func TestCheckpointStreamsSplitModel(t *testing.T) {
	ctx := context.Background()
	shape := GPTShape{Layers: 4, Heads: 2, Embd: 128, Vocab: 64, MaxSeq: 8}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			to := oocOptions()
			build := func() *Trainer {
				m, err := NewGPT(shape, dt)
				if err != nil {
					t.Fatal(err)
				}
				o := streamed()
				o.Optimizer, o.OptimizerTiers = offload.TierDisk, splitTiers(len(m.Layers), 1, 2)
				o.DiskDir, o.DiskBudget, o.DiskMaster = t.TempDir(), 64<<20, dt != kernels.F32
				o.Activations = recomputeBlocks(m)
				tr, _ := newOffloadAtPeak(t, m, to, o)
				return tr
			}
			steps := func(tr *Trainer, feed *rowsFeed, n int) []float64 {
				var l []float64
				for range n {
					r, err := tr.TrainStep(ctx, feed)
					if err != nil {
						t.Fatal(err)
					}
					l = append(l, r.Loss)
				}
				return l
			}
			ref := build()
			if err := ref.InitWeights(ctx, 7); err != nil {
				t.Fatal(err)
			}
			feed := oocFeed()
			steps(ref, feed, 2)

			var largest, total int64
			for _, l := range ref.model.Layers {
				for _, ps := range l.Params() {
					largest = max(largest, 4*int64(ps.Elems()))
				}
				total += 12 * int64(l.NumParams())
			}
			// The two files' I/O buffers, their headers (JSON, a few KiB a
			// tensor) and small change.
			const ioBuf = 2*safetensorsIOBuf + 512<<10
			dir := t.TempDir()
			var path string
			saveBytes := allocated(func() {
				w, o, err := ref.CheckpointTensors(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if path, err = SaveCheckpoint(dir, &Checkpoint{State: TrainState{Step: ref.Step}, Weights: w, Optim: o}, 0); err != nil {
					t.Fatal(err)
				}
			})
			t.Logf("%s: checkpoint of %s, largest tensor %s: saving allocated %s", dt, kernels.FormatBytes(total),
				kernels.FormatBytes(largest), kernels.FormatBytes(int64(saveBytes)))
			if int64(saveBytes) > largest+ioBuf || total < 4*(largest+ioBuf) {
				t.Errorf("saving allocated %d bytes: want at most the largest tensor %d + %d (of a %d-byte checkpoint)",
					saveBytes, largest, ioBuf, total)
			}
			wantL := steps(ref, feed, 2)
			wantW, err := ref.MasterWeights(ctx)
			if err != nil {
				t.Fatal(err)
			}

			fresh := build()
			var st *TrainState
			loadBytes := allocated(func() {
				if st, err = fresh.RestoreCheckpoint(ctx, path); err != nil {
					t.Fatal(err)
				}
			})
			if int64(loadBytes) > largest+ioBuf {
				t.Errorf("restoring allocated %d bytes: want at most the largest tensor %d + %d", loadBytes, largest, ioBuf)
			}
			fresh.Step = st.Step
			feed2 := oocFeed()
			hb := HostBatch{Input: make([]byte, 4*oocB*oocT), Targets: make([]byte, 4*oocB*oocT)}
			for range 2 * oocAccum {
				_ = feed2.Next(ctx, &hb)
			}
			gotL := steps(fresh, feed2, 2)
			gotW, err := fresh.MasterWeights(ctx)
			if err != nil {
				t.Fatal(err)
			}
			sameRun(t, "uninterrupted", wantL, gotL, wantW, gotW)
			if err := fresh.ResidencyErr(); err != nil {
				t.Errorf("residency table: %v", err)
			}
			// A flipped byte in a tensor is caught by the checksum.
			file := filepath.Join(path, CheckpointOptimFile)
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)-5] ^= 1
			if err := os.WriteFile(file, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := build().RestoreCheckpoint(ctx, path); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
				t.Errorf("corrupted checkpoint restored: %v", err)
			}
		})
	}
}
