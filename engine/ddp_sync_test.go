package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
)

// TestDataParallelInitBroadcast gives every rank its own InitWeights seed
// and wants the run to equal, bit for bit on every rank, the run in which
// every rank used rank 0's seed: InitWeights broadcasts rank 0's weights.
// Resident, out of core (optimizer on the host) and sharded (ZeroStage 2).
func TestDataParallelInitBroadcast(t *testing.T) {
	for _, c := range []ddpCase{
		{ranks: 2, accum: 1, steps: 2, clip: 1},
		{ranks: 3, accum: 1, steps: 2, clip: 0, offload: zeroOffload(true)},
		{ranks: 3, accum: 1, steps: 2, clip: 0, offload: zeroOffload(false), zero: 2},
	} {
		t.Run(fmt.Sprintf("ranks%d-offload%v-zero%d", c.ranks, c.offload != nil, c.zero), func(t *testing.T) {
			in, tg := randomRows(c.steps * c.ranks * c.accum * ddpB * ddpT)
			build := func(int) *Model { return tinyGPT(t, kernels.F32) }
			want := runRanks(t, c, in, tg, build) // every rank seed 42
			mixed := c
			mixed.seed = func(r int) uint64 { return 42 + 1000*uint64(r) }
			got := runRanks(t, mixed, in, tg, build)
			for r := range got {
				if want[r].err != nil || got[r].err != nil {
					t.Fatalf("rank %d: same seeds: %v; different seeds: %v", r, want[r].err, got[r].err)
				}
				for s := range got[r].losses {
					if got[r].losses[s] != want[0].losses[s] {
						t.Errorf("rank %d step %d: loss %v with different seeds, %v with rank 0's", r, s, got[r].losses[s], want[0].losses[s])
					}
				}
				zeroSameWeights(t, fmt.Sprintf("rank %d, different seeds vs rank 0's seed everywhere", r), got[r].weights, want[0].weights)
			}
		})
	}
}

// withRanks runs body on ranks goroutines, each with its own CPU backend,
// communicator and resident trainer of the tiny fp32 GPT (options to,
// Comm set), and returns their errors.
func withRanks(t *testing.T, ranks int, to TrainerOptions, body func(ctx context.Context, r int, tr *Trainer) error) []error {
	t.Helper()
	errs := make([]error, ranks)
	eachRank(t, ranks, func(ctx context.Context, r int, be kernels.Backend, id []byte) {
		comm, err := be.(kernels.CommOpener).OpenComm(ctx, id, r, ranks)
		if err != nil {
			errs[r] = err
			return
		}
		defer comm.Close()
		o := to
		o.Comm = comm
		tr, err := NewTrainer(be, tinyGPT(t, kernels.F32), o)
		if err != nil {
			errs[r] = err
			return
		}
		defer tr.Close()
		if errs[r] = body(ctx, r, tr); errs[r] != nil {
			_ = comm.Abort()
		}
	})
	return errs
}

// TestDataParallelEvaluate: under data parallelism Evaluate returns, on
// every rank bit for bit, the mean over all ranks' micro-batches; equal
// to one rank's Evaluate of the same micro-batches in rank order, bitwise
// with one micro-batch per rank (the float64 additions associate the
// same), within 1e-14 relative with several (they associate differently;
// each micro-batch's mean is the same bits either way).
func TestDataParallelEvaluate(t *testing.T) {
	c := ddpCase{ranks: 3, accum: 1, steps: 1, clip: 1}
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("batches%d", n), func(t *testing.T) {
			in, tg := randomRows(c.ranks * n * ddpB * ddpT)
			feed := func(from, count int) *mbFeed {
				f := &mbFeed{in: in, tg: tg, n: ddpB * ddpT}
				for k := range count {
					f.idx = append(f.idx, from+k)
				}
				return f
			}
			got := make([]float64, c.ranks)
			errs := withRanks(t, c.ranks, c.options(), func(ctx context.Context, r int, tr *Trainer) error {
				if err := tr.InitWeights(ctx, 42); err != nil {
					return err
				}
				var err error
				got[r], err = tr.Evaluate(ctx, feed(r*n, n), n)
				return err
			})
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			ctx := context.Background()
			one, err := NewTrainer(openCPU(t), tinyGPT(t, kernels.F32), c.options())
			if err != nil {
				t.Fatal(err)
			}
			defer one.Close()
			if err := one.InitWeights(ctx, 42); err != nil {
				t.Fatal(err)
			}
			want, err := one.Evaluate(ctx, feed(0, c.ranks*n), c.ranks*n)
			if err != nil {
				t.Fatal(err)
			}
			local, err := one.Evaluate(ctx, feed(0, n), n) // rank 0's share alone
			if err != nil {
				t.Fatal(err)
			}
			for r := range got {
				if got[r] != got[0] {
					t.Errorf("rank %d: eval loss %v, rank 0 %v", r, got[r], got[0])
				}
			}
			if d := math.Abs(got[0] - want); n == 1 && d != 0 || d > 1e-14*want {
				t.Errorf("eval loss %v over %d ranks, %v on one rank of the union (diff %.3g)", got[0], c.ranks, want, d)
			}
			if got[0] == local {
				t.Errorf("eval loss %v is rank 0's own: not reduced", local)
			}
			t.Logf("eval loss %v over %d ranks, %v on one rank (rank 0's share alone: %v)", got[0], c.ranks, want, local)
		})
	}
}

// TestDataParallelResumeMismatch: ranks that restored different
// checkpoints fail, every one of them, naming the ranks that differ.
func TestDataParallelResumeMismatch(t *testing.T) {
	c := ddpCase{ranks: 3, accum: 1, steps: 1, clip: 1}
	errs := withRanks(t, c.ranks, c.options(), func(ctx context.Context, r int, tr *Trainer) error {
		st := &TrainState{Step: 7, Files: map[string]string{CheckpointModelFile: "aa", CheckpointOptimFile: "bb"}}
		if r == 2 {
			st.Files[CheckpointModelFile] = "cc"
		}
		return tr.checkSameCheckpoint(ctx, st)
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "resumed from different checkpoints") || !strings.Contains(err.Error(), "ranks [2]") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	t.Logf("rank 0: %v", errs[0])
	ok := withRanks(t, c.ranks, c.options(), func(ctx context.Context, r int, tr *Trainer) error {
		return tr.checkSameCheckpoint(ctx, &TrainState{Step: 7, Files: map[string]string{CheckpointModelFile: "aa"}})
	})
	for r, err := range ok {
		if err != nil {
			t.Errorf("rank %d, same checkpoint: %v", r, err)
		}
	}
}

// TestRemapCursor: a run whose ranks read part of an epoch with one world
// size continues with another from the remapped cursor, reading every
// sample of the epoch the old ranks had not read and none twice (the
// sampler's round-robin over a global order that depends only on seed and
// epoch); a cursor that the new ranks cannot share equally is refused
// with an error naming both world sizes.
func TestRemapCursor(t *testing.T) {
	const n, seed = 37, 9
	read := func(world int, from dataset.Cursor, count int64) map[int64]int {
		seen := map[int64]int{}
		for r := range world {
			s, err := dataset.NewSampler(n, dataset.SamplerOptions{Shuffle: true, Seed: seed, Rank: r, WorldSize: world})
			if err != nil {
				t.Fatal(err)
			}
			o := s.Order(from.Epoch)
			end := o.Len()
			if count >= 0 {
				end = from.Position + count
			}
			for p := from.Position; p < end; p++ {
				seen[o.At(p)]++
			}
		}
		return seen
	}
	for _, c := range []struct{ from, to, pos int }{{2, 3, 6}, {3, 2, 4}, {1, 4, 8}, {4, 1, 3}, {2, 2, 5}} {
		t.Run(fmt.Sprintf("%dto%d", c.from, c.to), func(t *testing.T) {
			old := dataset.Cursor{Seed: seed, Epoch: 1, Position: int64(c.pos)}
			before := read(c.from, dataset.Cursor{Epoch: 1}, int64(c.pos))
			cur, err := RemapCursor(old, c.from, c.to)
			if err != nil {
				t.Fatal(err)
			}
			if cur.Position*int64(c.to) != old.Position*int64(c.from) || cur.Epoch != old.Epoch || cur.Seed != old.Seed {
				t.Fatalf("remapped %v to %v", old, cur)
			}
			after := read(c.to, cur, -1)
			for i, k := range after {
				if k != 1 || before[i] != 0 {
					t.Errorf("sample %d read %d times after the resume, %d before", i, k, before[i])
				}
			}
			// Together: the first (n/to)·to samples of the epoch's global order.
			want := read(1, dataset.Cursor{Epoch: 1}, int64(n/c.to*c.to))
			if len(before)+len(after) != len(want) {
				t.Errorf("%d samples before and %d after the resume, want %d in all", len(before), len(after), len(want))
			}
			for i := range want {
				if before[i]+after[i] != 1 {
					t.Errorf("sample %d: read %d times before the resume and %d after", i, before[i], after[i])
				}
			}
		})
	}
	_, err := RemapCursor(dataset.Cursor{Seed: seed, Epoch: 0, Position: 5}, 2, 3)
	if err == nil || !strings.Contains(err.Error(), "WORLD_SIZE 3") || !strings.Contains(err.Error(), "WORLD_SIZE 2") {
		t.Fatalf("2 ranks at position 5 to 3 ranks: %v", err)
	}
	t.Log(err)
}

// TestRunResumeRemapsCursor: Run resumes a checkpoint saved by 2 ranks
// (its state.json rewritten as 2 ranks would have written it: world_size
// 2, each rank's cursor half the samples) with one process, remaps the
// cursor to the global position and trains on exactly the batches of the
// run that never stopped: the same losses, bit for bit.
func TestRunResumeRemapsCursor(t *testing.T) {
	data := writeTokens(t, 32, 16, 8000)
	const N = 4
	base := tinyConfig(data)
	base.Steps = N
	base.CheckpointEvery = 100
	a := base
	a.CheckpointDir = filepath.Join(t.TempDir(), "a")
	var la stepLog
	if _, err := Run(context.Background(), a, RunOptions{Reporter: &la}); err != nil {
		t.Fatal(err)
	}
	b := base
	b.CheckpointDir = filepath.Join(t.TempDir(), "b")
	ctx, cancel := context.WithCancel(context.Background())
	sb, err := Run(ctx, b, RunOptions{Reporter: ReporterFunc(func(m StepMetrics) {
		if m.Step == N/2 {
			cancel() // checkpointed at step N/2, with the same schedule as a's
		}
	})})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: %v", err)
	}
	file := filepath.Join(sb.Checkpoint, CheckpointStateFile)
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st["world_size"] != 1.0 {
		t.Fatalf("state.json world_size %v, want 1", st["world_size"])
	}
	cur := st["cursor"].(map[string]any)
	pos := int64(cur["position"].(float64))
	if pos%2 != 0 || pos == 0 {
		t.Fatalf("cursor position %d: want an even, nonzero one", pos)
	}
	cur["position"], st["world_size"] = pos/2, 2
	if raw, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	b.Resume = true
	var lb stepLog
	var log strings.Builder
	if _, err := Run(context.Background(), b, RunOptions{Reporter: &lb, Log: &log}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "resuming with 1 ranks a run saved with 2") {
		t.Errorf("log does not mention the remap:\n%s", log.String())
	}
	got, want := lb.losses(), la.losses()[N/2:]
	if len(got) != len(want) {
		t.Fatalf("%d losses after the resume, want %d", len(got), len(want))
	}
	for i := range want {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
			t.Errorf("step %d: loss %v after the resume, %v straight", N/2+i+1, got[i], want[i])
		}
	}
}
