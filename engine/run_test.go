package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spill-ml/spill/dataset"
)

// writeTokens writes a token dataset of n tokens that follow a learnable
// rule (next = 7·prev+3 mod vocab) with 10% random tokens.
func writeTokens(t *testing.T, vocab, seqLen, n int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tokens")
	ctx := context.Background()
	w, err := dataset.Create(ctx, dir, dataset.WriterOptions{Schema: dataset.Schema{
		Kind: dataset.KindTokens, TokenDType: "uint16", SeqLen: seqLen, VocabSize: vocab}})
	if err != nil {
		t.Fatal(err)
	}
	r := &rng{s: 11}
	buf := make([]byte, 2*n)
	tok := uint16(1)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint16(buf[2*i:], tok)
		if r.next()%10 == 0 {
			tok = uint16(r.next() % uint64(vocab))
		} else {
			tok = uint16((int(tok)*7 + 3) % vocab)
		}
	}
	if _, err := w.Write(buf); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tinyConfig is a CI-sized GPT config over data.
func tinyConfig(data string) Config {
	c := DefaultConfig()
	c.Data = data
	c.Layers, c.Heads, c.Embd, c.MaxSeq = 2, 2, 32, 16
	c.Batch, c.SeqLen = 4, 16
	c.Steps, c.Warmup = 40, 4
	c.LR = 1e-2
	c.Precision = "fp32"
	c.EvalEvery = 0
	c.Threads = 2
	return c
}

type stepLog struct{ m []StepMetrics }

func (s *stepLog) Report(m StepMetrics) { s.m = append(s.m, m) }

func (s *stepLog) losses() []float64 {
	var l []float64
	for _, m := range s.m {
		l = append(l, m.Loss)
	}
	return l
}

func TestRunLossDecreases(t *testing.T) {
	data := writeTokens(t, 32, 16, 20000)
	cfg := tinyConfig(data)
	cfg.EvalEvery, cfg.EvalBatches = 20, 2
	var log stepLog
	sum, err := Run(context.Background(), cfg, RunOptions{Reporter: &log})
	if err != nil {
		t.Fatal(err)
	}
	if len(log.m) != cfg.Steps || sum.Steps != cfg.Steps {
		t.Fatalf("%d reports, summary %d steps; want %d", len(log.m), sum.Steps, cfg.Steps)
	}
	first, last := sum.FirstLoss, sum.LastLoss
	if math.Abs(first-math.Log(32)) > 0.3 {
		t.Errorf("initial loss %.3f, want about ln(32) = %.3f", first, math.Log(32))
	}
	if last > 0.7*first {
		t.Errorf("loss %.3f -> %.3f: did not drop below 70%%", first, last)
	}
	if sum.EvalLoss == nil || *sum.EvalLoss > 0.7*first {
		t.Errorf("eval loss %v, want < %.3f", sum.EvalLoss, 0.7*first)
	}
	if log.m[19].EvalLoss == nil || log.m[18].EvalLoss != nil {
		t.Errorf("evaluation should run at step 20 only (and the last)")
	}
	if sum.PeakDeviceBytes <= 0 {
		t.Errorf("peak device bytes %d", sum.PeakDeviceBytes)
	}
	// The start-up phases, in order, add up to the time to the first step.
	var names []string
	var total time.Duration
	for _, p := range sum.StartUp {
		names = append(names, p.Name)
		total += p.D
	}
	if got := strings.Join(names, ","); got != "open,plan,state,weights,step 1" || total > sum.FirstStepAt || total < sum.FirstStepAt*9/10 {
		t.Errorf("start-up phases %v (total %v), first step at %v", sum.StartUp, total, sum.FirstStepAt)
	}
}

// TestPrecisionTracksFP32 trains the same model in bf16 and fp16: every
// step's loss stays within 5% of the fp32 run's.
func TestPrecisionTracksFP32(t *testing.T) {
	data := writeTokens(t, 32, 16, 8000)
	losses := map[string][]float64{}
	for _, p := range []string{"fp32", "bf16", "fp16"} {
		cfg := tinyConfig(data)
		cfg.Steps = 25
		cfg.Precision = p
		var log stepLog
		if _, err := Run(context.Background(), cfg, RunOptions{Reporter: &log}); err != nil {
			t.Fatal(p, err)
		}
		losses[p] = log.losses()
		for _, m := range log.m {
			if m.Skipped {
				t.Errorf("%s: step %d skipped", p, m.Step)
			}
		}
	}
	ref := losses["fp32"]
	for _, p := range []string{"bf16", "fp16"} {
		for i, l := range losses[p] {
			if math.Abs(l-ref[i]) > 0.05*ref[i] {
				t.Errorf("%s step %d: loss %.4f, fp32 %.4f (more than 5%% apart)", p, i+1, l, ref[i])
			}
		}
	}
	if losses["bf16"][0] == ref[0] {
		t.Errorf("bf16 loss equals fp32 loss exactly: precision not applied?")
	}
}

// TestResumeBitwise runs N steps straight, and N/2 steps interrupted by
// cancellation followed by a resumed run: the losses of the second half and
// the final checkpoints are bitwise identical.
func TestResumeBitwise(t *testing.T) {
	data := writeTokens(t, 32, 16, 8000)
	const N = 12
	base := tinyConfig(data)
	base.Steps = N
	base.Precision = "fp16" // exercises the loss-scale state too
	base.CheckpointEvery = 100
	base.ScaleWindow = 3

	a := base
	a.CheckpointDir = filepath.Join(t.TempDir(), "a")
	var la stepLog
	sa, err := Run(context.Background(), a, RunOptions{Reporter: &la})
	if err != nil {
		t.Fatal(err)
	}

	b := base
	b.CheckpointDir = filepath.Join(t.TempDir(), "b")
	ctx, cancel := context.WithCancel(context.Background())
	var lb1 stepLog
	_, err = Run(ctx, b, RunOptions{Reporter: ReporterFunc(func(m StepMetrics) {
		lb1.Report(m)
		if m.Step == N/2 {
			cancel()
		}
	})})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: err %v, want context.Canceled", err)
	}
	if len(lb1.m) != N/2 {
		t.Fatalf("interrupted run took %d steps, want %d", len(lb1.m), N/2)
	}
	b.Resume = true
	var lb2 stepLog
	sb, err := Run(context.Background(), b, RunOptions{Reporter: &lb2})
	if err != nil {
		t.Fatal(err)
	}
	got := append(lb1.losses(), lb2.losses()...)
	want := la.losses()
	if len(got) != len(want) {
		t.Fatalf("%d losses, want %d", len(got), len(want))
	}
	for i := range want {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
			t.Errorf("step %d: loss %v after resume, %v straight", i+1, got[i], want[i])
		}
		if i >= N/2 && lb2.m[i-N/2].LossScale != la.m[i].LossScale {
			t.Errorf("step %d: loss scale %v after resume, %v straight", i+1, lb2.m[i-N/2].LossScale, la.m[i].LossScale)
		}
	}
	ca, err := LoadCheckpoint(sa.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := LoadCheckpoint(sb.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if ca.State.Step != N || cb.State.Step != N || ca.State.Cursor != cb.State.Cursor {
		t.Errorf("states differ: %+v vs %+v", ca.State.Cursor, cb.State.Cursor)
	}
	for _, pair := range [][2][]NamedTensor{{ca.Weights, cb.Weights}, {ca.Optim, cb.Optim}} {
		if len(pair[0]) != len(pair[1]) || len(pair[0]) == 0 {
			t.Fatalf("%d vs %d tensors", len(pair[0]), len(pair[1]))
		}
		for i := range pair[0] {
			if pair[0][i].Name != pair[1][i].Name || !bytes.Equal(pair[0][i].Data, pair[1][i].Data) {
				t.Errorf("tensor %s differs after resume", pair[0][i].Name)
			}
		}
	}
}

// writeRecords writes n records of 4 float32 features; the int32 label is
// the quadrant of (x0, x1) (classification) or the float32 label is
// 2·x0 - x1 (regression).
func writeRecords(t *testing.T, n int, regression bool) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "records")
	ctx := context.Background()
	lab := "int32"
	if regression {
		lab = "float32"
	}
	w, err := dataset.Create(ctx, dir, dataset.WriterOptions{Schema: dataset.Schema{
		Kind: dataset.KindRecords, FeatureDType: "float32", Features: 4, LabelDType: lab}})
	if err != nil {
		t.Fatal(err)
	}
	r := &rng{s: 21}
	x := make([]float32, 4)
	rec := make([]byte, 20)
	for i := 0; i < n; i++ {
		r.fillNormal(x, 1)
		putF32(rec, x)
		if regression {
			putF32(rec[16:], []float32{2*x[0] - x[1]})
		} else {
			c := int32(0)
			if x[0] > 0 {
				c++
			}
			if x[1] > 0 {
				c += 2
			}
			putI32(rec[16:], []int32{c})
		}
		if err := w.AppendRecord(rec); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestRunMLP(t *testing.T) {
	for _, reg := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.Data = writeRecords(t, 2000, reg)
		cfg.Model = "mlp"
		cfg.Hidden = []int{32}
		cfg.Batch, cfg.Steps, cfg.Warmup, cfg.LR = 32, 60, 3, 1e-2
		cfg.EvalEvery, cfg.EvalBatches, cfg.Threads = 30, 2, 2
		sum, err := Run(context.Background(), cfg, RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sum.LastLoss > 0.5*sum.FirstLoss || sum.EvalLoss == nil || *sum.EvalLoss > 0.5*sum.FirstLoss {
			t.Errorf("regression=%v: loss %.3f -> %.3f (eval %v): did not halve", reg, sum.FirstLoss, sum.LastLoss, sum.EvalLoss)
		}
	}
}

func TestRunRejectsMismatchedData(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Data = writeRecords(t, 100, false)
	cfg.Threads = 2
	if _, err := Run(context.Background(), cfg, RunOptions{}); err == nil || !strings.Contains(err.Error(), "tokens dataset") {
		t.Fatalf("GPT on records: err %v", err)
	}
	cfg = tinyConfig(writeTokens(t, 32, 16, 2000))
	cfg.Vocab = 16 // tokens go up to 31
	if _, err := Run(context.Background(), cfg, RunOptions{}); err == nil || !strings.Contains(err.Error(), "vocabulary") || !strings.Contains(err.Error(), "--vocab") {
		t.Fatalf("small vocab: err %v", err)
	}
}

func TestRunDefaultDataset(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	cfg := tinyConfig("")
	cfg.SeqLen, cfg.Steps, cfg.Warmup, cfg.Batch = 16, 3, 1, 2
	var log stepLog
	sum, err := Run(context.Background(), cfg, RunOptions{Reporter: &log})
	if err != nil {
		t.Fatal(err)
	}
	// Byte-level vocabulary: the initial loss is about ln(257).
	if len(log.m) != 3 || math.Abs(sum.FirstLoss-math.Log(257)) > 0.5 {
		t.Fatalf("%d steps, first loss %.3f; want 3 steps from about %.3f", len(log.m), sum.FirstLoss, math.Log(257))
	}
}
