package exec_test

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/exec"
	"github.com/spill-ml/spill/offload/schedule"
	"github.com/spill-ml/spill/stream"
)

// selChain is a toy model whose layers have selective checkpoints: a
// layer's activations are [out | saved | rest] (N float32 each), its
// checkpoint the first two. Forward: out = in + w, saved = out + w, rest
// = saved + w; a recompute writes rest from saved alone, so it is right
// only if the executor has restored the checkpoint; the backward adds rest
// to the weights' gradient. Micro-batch k's input is k+1 everywhere.
type selChain struct {
	be         kernels.Backend
	n, N       int
	w, g       []kernels.Tensor
	act, dgrad []kernels.Tensor
	ones, in   kernels.Tensor
}

func (c *selChain) Bind(iv *schedule.Interval, b kernels.Buffer) {
	switch iv.Class {
	case schedule.Weights:
		c.w[iv.Layer] = kernels.View(b, 0, kernels.F32, c.N)
	case schedule.Grads:
		c.g[iv.Layer] = kernels.View(b, 0, kernels.F32, c.N)
	case schedule.Acts, schedule.Ckpt:
		c.act[iv.Layer] = kernels.View(b, 0, kernels.F32, int(iv.Bytes/4))
	case schedule.DGrad:
		c.dgrad[iv.Layer] = kernels.View(b, 0, kernels.F32, c.N)
	}
}

func (c *selChain) part(l, k int) kernels.Tensor { return c.act[l].Slice(k*c.N, c.N) }

func (c *selChain) Run(q kernels.Queue, op schedule.Op, final []int) {
	i := op.Layer
	in := c.in
	if i > 0 {
		in = c.part(i-1, 0)
	} else {
		c.be.Fill(q, c.in, float32(op.MB+1))
	}
	out, saved, rest := c.part(i, 0), c.part(i, 1), c.part(i, 2)
	switch op.Kind {
	case schedule.Forward:
		c.be.CopyDevice(q, out, in)
		c.be.Add(q, out, c.w[i])
		c.be.CopyDevice(q, saved, out)
		c.be.Add(q, saved, c.w[i])
		c.be.CopyDevice(q, rest, saved)
		c.be.Add(q, rest, c.w[i])
	case schedule.Recompute:
		c.be.CopyDevice(q, rest, saved)
		c.be.Add(q, rest, c.w[i])
	case schedule.Backward:
		c.be.Add(q, c.g[i], rest)
		if i > 0 {
			c.be.CopyDevice(q, c.dgrad[i-1], c.ones)
		}
	}
}

func (c *selChain) LayerName(l int) string { return "layer" }

// TestSelectiveRestore: layer-major over 3 micro-batches, the middle
// layers recomputed selectively with their checkpoints on the device or
// on the host, every layer's gradient is the sum over the micro-batches
// of what its forward computed: the checkpoint came back before each
// recompute.
func TestSelectiveRestore(t *testing.T) {
	const n, N, micro = 5, 256, 3
	for _, pol := range []offload.ActPolicy{offload.RecomputeSelective, offload.RecomputeSelectiveHost} {
		t.Run(pol.String(), func(t *testing.T) {
			be, err := kernels.Open("cpu", kernels.Config{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			spec := schedule.Spec{MicroBatches: micro, Group: micro, Weights: offload.TierHost, Grads: offload.TierHost, Prefetch: 1, Train: true}
			for i := 0; i < n; i++ {
				out := int64(4 * N)
				if i == n-1 {
					out = 0
				}
				spec.Layers = append(spec.Layers, schedule.Layer{ParamBytes: 4 * N, ActBytes: 12 * N, OutBytes: out, SaveBytes: 8 * N})
				spec.Acts = append(spec.Acts, pol)
			}
			prog, err := schedule.Compile(spec)
			if err != nil {
				t.Fatal(err)
			}
			peak, _ := prog.Peak()
			ss, err := stream.NewSet(be, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ss.Close()
			cache := offload.NewCache(be, offload.CacheConfig{Limit: peak, Whole: true})
			table := offload.NewTable()
			h := &host{}
			for l := 0; l < n; l++ {
				w := make([]byte, 4*N)
				for j := 0; j < N; j++ {
					binary.LittleEndian.PutUint32(w[4*j:], math.Float32bits(float32(10*(l+1))))
				}
				h.w, h.g = append(h.w, w), append(h.g, make([]byte, 4*N))
				for _, cl := range []offload.Class{offload.Weights, offload.Grads} {
					if err := table.Add(offload.Key{Layer: l, Class: cl}, 4*N, offload.TierHost); err != nil {
						t.Fatal(err)
					}
				}
			}
			fixed := func() kernels.Tensor {
				b, err := be.Alloc(4*N, "io")
				if err != nil {
					t.Fatal(err)
				}
				return kernels.View(b, 0, kernels.F32, N)
			}
			m := &selChain{be: be, n: n, N: N, w: make([]kernels.Tensor, n), g: make([]kernels.Tensor, n),
				act: make([]kernels.Tensor, n), dgrad: make([]kernels.Tensor, n), ones: fixed(), in: fixed()}
			be.Fill(be.DefaultQueue(), m.ones, 1)
			if err := be.DefaultQueue().Synchronize(context.Background()); err != nil {
				t.Fatal(err)
			}
			var hostSlots []byte
			ex, err := exec.New(exec.Config{Backend: be, Queues: exec.Queues{Compute: ss.Compute, H2D: ss.H2D, D2H: ss.D2H},
				Cache: cache, Table: table, HostAlloc: func(n int64) []byte {
					b := make([]byte, n)
					hostSlots = append(hostSlots, b...)
					return b
				}}, prog)
			if err != nil {
				t.Fatal(err)
			}
			defer ex.Close()
			if err := ex.Run(context.Background(), prog, m, h); err != nil {
				t.Fatal(err)
			}
			// Layer l's input is k+1 plus the weights before it; rest
			// adds 3 of its own.
			for l := 0; l < n; l++ {
				var want float64
				for k := 0; k < micro; k++ {
					x := float64(k + 1)
					for j := 0; j < l; j++ {
						x += float64(10 * (j + 1))
					}
					want += x + 3*float64(10*(l+1))
				}
				for j := 0; j < N; j++ {
					if got := math.Float32frombits(binary.LittleEndian.Uint32(h.g[l][4*j:])); float64(got) != want {
						t.Fatalf("layer %d: gradient[%d] = %v, want %v", l, j, got, want)
					}
				}
			}
			if pol.CkptOnHost() && len(hostSlots) == 0 {
				t.Fatal("no host slots for checkpoints on the host")
			}
		})
	}
}
