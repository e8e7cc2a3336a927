package engine

import (
	"context"
	"testing"
	"time"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/kernels/cpu"
	"github.com/spill-ml/spill/stream"
)

// BenchmarkOffloadOverlap trains the out-of-core GPT streamed layer by
// layer on the CPU backend with a simulated host-device link (20 µs per
// copy plus 2 GB/s) and reports, from the stream trace, the fraction of
// transfer time hidden behind compute ("hidden"), the transfer, compute
// and exposed optimizer time per step. Sub-benchmarks: "sync" clips
// gradients, so the host AdamW waits for the global norm; "eager" does not
// clip, so each layer's update starts when its gradients land; "delayed"
// runs each step's update during the next step (DelayedUpdate);
// "accum4" and "layer-major4" accumulate 4 micro-batches, micro-batch-major
// and layer-major, and report the bytes moved per step.
func BenchmarkOffloadOverlap(b *testing.B) {
	for _, mode := range []string{"sync", "eager", "delayed", "accum4", "layer-major4"} {
		b.Run(mode, func(b *testing.B) { benchOverlap(b, mode) })
	}
}

func benchOverlap(b *testing.B, mode string) {
	shape := GPTShape{Layers: 16, Heads: 4, Embd: 64, Vocab: 64, MaxSeq: 32}
	m, err := NewGPT(shape, kernels.F32)
	if err != nil {
		b.Fatal(err)
	}
	be, err := cpu.Open(kernels.Config{Threads: 2, MemoryLimit: stateBytes(m) / 4})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	be.SetCopyLatency(20*time.Microsecond, 2e9)
	rec := stream.NewRecorder()
	o := streamed()
	o.Prefetch = 2
	o.DeviceBudget = stateBytes(m) / 4
	o.Activations = recomputeBlocks(m)
	o.Recorder = rec
	o.DelayedUpdate = mode == "delayed"
	to := oocOptions()
	to.B, to.T, to.Accum = 2, 32, 1
	if mode == "eager" {
		to.GradClip = 0
	}
	if mode == "accum4" || mode == "layer-major4" {
		to.Accum = 4
		if mode == "layer-major4" {
			o.Group = 4
		}
	}
	tr, err := NewOffloadTrainer(be, m, to, o)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
	if err := tr.InitWeights(ctx, 1); err != nil {
		b.Fatal(err)
	}
	r := &rng{s: 5}
	n := 4 * to.B * to.T
	in, tg := make([]int32, n), make([]int32, n)
	for i := range in {
		in[i], tg[i] = int32(r.next()%64), int32(r.next()%64)
	}
	feed := &rowsFeed{in: in, tg: tg, T: to.T, perBatch: to.B}
	if _, err := tr.TrainStep(ctx, feed); err != nil { // warm-up
		b.Fatal(err)
	}
	b.ResetTimer()
	var moved int64
	for i := 0; i < b.N; i++ {
		end := rec.BeginStep(i)
		r, err := tr.TrainStep(ctx, feed)
		moved += r.H2DBytes + r.D2HBytes
		if err == nil && !o.DelayedUpdate {
			err = tr.off.host.waitUpdates() // the step includes its update
		}
		end()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := tr.off.host.waitUpdates(); err != nil {
		b.Fatal(err)
	}
	tr.off.streams.Close() // stamp every traced op
	var xfer, exposed, comp, opt time.Duration
	for _, bd := range stream.Breakdowns(rec.Spans()) {
		xfer += bd.Transfer
		exposed += bd.ExposedTransfer
		comp += bd.Compute
		opt += bd.ExposedOptimizer
	}
	if xfer > 0 {
		b.ReportMetric(1-float64(exposed)/float64(xfer), "hidden")
		b.ReportMetric(float64(xfer.Microseconds())/float64(b.N), "transfer-µs/step")
		b.ReportMetric(float64(comp.Microseconds())/float64(b.N), "compute-µs/step")
		b.ReportMetric(float64(opt.Microseconds())/float64(b.N), "exposed-opt-µs/step")
		b.ReportMetric(float64(moved)/float64(b.N)/(1<<20), "MiB-moved/step")
	}
}
