package engine

import (
	"context"
	"fmt"
	"io"

	"github.com/spill-ml/spill/dataset"
)

// EvalResult is what Eval measured.
type EvalResult struct {
	Loss    float64 `json:"loss"`    // mean loss per target over the batches
	Batches int     `json:"batches"` // micro-batches evaluated
	Rows    int     `json:"rows"`    // sequences (records) per micro-batch
	T       int     `json:"seq_len"` // positions per sequence (1 for records)
	Data    string  `json:"data"`    // the dataset evaluated
	Model   string  `json:"model"`   // the model's shape, as the log describes it
	Weights string  `json:"weights"` // where the weights came from (InitFrom, or "random (seed N)")
}

// Eval computes the loss of a model on fixed batches, the evaluation a
// training run reports, without training: cfg.EvalBatches micro-batches
// of cfg.Batch rows taken in order from the start of cfg.EvalData, else of
// cfg.Data (the whole dataset: no held-out split), wrapping around if the
// data is shorter. The weights are cfg.InitFrom's (else the random
// initialisation of cfg.Seed). Row k of batch b is sample b·Batch + k,
// so a Python check can rebuild exactly these batches from the tokens.
// It runs a forward-only trainer (newForwardTrainer): the weights on the
// host, no gradients or optimizer state, the device holding about one
// layer's weights and activations at a time; the loss is bitwise the
// one a training trainer's Evaluate gives.
func Eval(ctx context.Context, cfg Config, log io.Writer) (*EvalResult, error) {
	logf := func(format string, args ...any) {
		if log != nil {
			fmt.Fprintf(log, format+"\n", args...)
		}
	}
	cfg.Resume, cfg.ResumeFrom = false, ""
	if err := ResolveInitFrom(&cfg); err != nil {
		return nil, err
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir := cfg.EvalData
	if dir == "" {
		dir = cfg.Data
	}
	dir, err := dataDirOrDefault(ctx, dir)
	if err != nil {
		return nil, err
	}
	ds, err := dataset.Open(dir)
	if err != nil {
		return nil, err
	}
	defer ds.Close()
	rs, err := openRun(&cfg, ds, dir, 0, logf)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	model, pre, be := rs.model, rs.pre, rs.be
	B, T := cfg.Batch, cfg.SeqLen
	if !cfg.tokens() {
		T = 1
	}
	// A forward-only trainer: the weights on the host, streamed through
	// the device layer by layer with the activations of the forward;
	// no gradients or optimizer state anywhere (newForwardTrainer).
	tr, err := newForwardTrainer(be, model, B, T, deviceBudget(&cfg, be))
	if err != nil {
		return nil, fmt.Errorf("engine: eval: %w", err)
	}
	defer tr.Close()
	res := &EvalResult{Batches: cfg.EvalBatches, Rows: B, T: T, Data: dir, Model: describeShape(model),
		Weights: fmt.Sprintf("random (seed %d)", cfg.Seed)}
	if pre != nil {
		if err := tr.LoadPretrained(ctx, pre); err != nil {
			return nil, err
		}
		res.Weights = fmt.Sprintf("%s (%s layout)", pre.Where, pre.Layout())
	} else if err := tr.InitWeights(ctx, cfg.Seed); err != nil {
		return nil, err
	}
	logf("model %s: %s, %s on %s; weights %s", cfg.Model, res.Model, cfg.Precision, be.DeviceName(), res.Weights)
	feed := &seqFeed{src: ds, dec: newDecoder(model, ds.Schema(), B, T, dir), buf: make([]byte, ds.SampleSize())}
	if res.Loss, err = tr.Evaluate(ctx, feed, cfg.EvalBatches); err != nil {
		return nil, err
	}
	return res, nil
}
