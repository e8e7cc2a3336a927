package exec_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/spill-ml/spill/kernels"
	_ "github.com/spill-ml/spill/kernels/cpu"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/exec"
	"github.com/spill-ml/spill/offload/schedule"
	"github.com/spill-ml/spill/stream"
)

// chain is a toy model of n layers of N float32 weights: layer i's output
// is its input plus its weights; the last layer's backward starts from a
// gradient of ones. So every layer's weight gradient is one per element
// and micro-batch.
type chain struct {
	be      kernels.Backend
	n, N    int
	w, g    []kernels.Tensor // bound per layer
	act     []kernels.Tensor // bound per layer (output first)
	dgrad   []kernels.Tensor // bound per layer: the gradient of its output
	ones    kernels.Tensor
	in      kernels.Tensor
	scratch kernels.Tensor
}

func (c *chain) Bind(iv *schedule.Interval, b kernels.Buffer) {
	t := kernels.View(b, 0, kernels.F32, c.N)
	switch iv.Class {
	case schedule.Weights:
		c.w[iv.Layer] = t
	case schedule.Grads:
		c.g[iv.Layer] = t
	case schedule.Acts, schedule.Ckpt:
		c.act[iv.Layer] = t
	case schedule.DGrad:
		c.dgrad[iv.Layer] = t
	}
}

func (c *chain) Run(q kernels.Queue, op schedule.Op, final []int) {
	i := op.Layer
	in := c.in
	if i > 0 {
		in = c.act[i-1]
	}
	switch op.Kind {
	case schedule.Forward, schedule.Recompute:
		c.be.CopyDevice(q, c.act[i], in)
		c.be.Add(q, c.act[i], c.w[i])
	case schedule.Backward:
		dout := c.ones
		if i < c.n-1 {
			dout = c.dgrad[i]
		}
		c.be.Add(q, c.g[i], dout) // dL/dw = dL/dout
		if i > 0 {
			c.be.CopyDevice(q, c.dgrad[i-1], dout) // dL/din = dL/dout
		}
	}
}

func (c *chain) LayerName(l int) string { return fmt.Sprintf("layer %d", l) }

// host keeps the weights and gradients of every layer in Go memory.
type host struct{ w, g [][]byte }

func (h *host) Weights(ctx context.Context, l int) ([]byte, error) { return h.w[l], nil }
func (h *host) Grads(l int) []byte                                 { return h.g[l] }
func (h *host) GradsOut(l int, ev kernels.Event)                   {}

// Example runs the step of a 4-layer model whose weights stream through
// the device, layer-major over 3 micro-batches with recomputed
// activations: each layer's weights come in once for the forward of all
// micro-batches and once for their backward (the last layer's once, its
// forward and backward being adjacent), and its gradients accumulate on
// the device and leave once.
func Example() {
	const n, N, micro = 4, 1024, 3
	be, err := kernels.Open("cpu", kernels.Config{Threads: 1})
	if err != nil {
		panic(err)
	}
	defer be.Close()
	spec := schedule.Spec{MicroBatches: micro, Group: micro, Weights: offload.TierHost, Grads: offload.TierHost,
		Prefetch: 1, Train: true}
	for i := 0; i < n; i++ {
		out := int64(4 * N)
		if i == n-1 {
			out = 0
		}
		spec.Layers = append(spec.Layers, schedule.Layer{ParamBytes: 4 * N, ActBytes: 4 * N, OutBytes: out})
		spec.Acts = append(spec.Acts, offload.Recompute)
	}
	prog, err := schedule.Compile(spec)
	if err != nil {
		panic(err)
	}
	peak, _ := prog.Peak()
	ss, err := stream.NewSet(be, nil)
	if err != nil {
		panic(err)
	}
	defer ss.Close()
	cache := offload.NewCache(be, offload.CacheConfig{Limit: peak, Whole: true})
	table := offload.NewTable()
	h := &host{}
	for l := 0; l < n; l++ {
		h.w = append(h.w, make([]byte, 4*N))
		h.g = append(h.g, make([]byte, 4*N))
		for _, cl := range []offload.Class{offload.Weights, offload.Grads} {
			if err := table.Add(offload.Key{Layer: l, Class: cl}, 4*N, offload.TierHost); err != nil {
				panic(err)
			}
		}
	}
	fixed := func() kernels.Tensor {
		b, err := be.Alloc(4*N, "io")
		if err != nil {
			panic(err)
		}
		return kernels.View(b, 0, kernels.F32, N)
	}
	m := &chain{be: be, n: n, N: N, w: make([]kernels.Tensor, n), g: make([]kernels.Tensor, n),
		act: make([]kernels.Tensor, n), dgrad: make([]kernels.Tensor, n), ones: fixed(), in: fixed()}
	be.Fill(be.DefaultQueue(), m.ones, 1)
	if err := be.DefaultQueue().Synchronize(context.Background()); err != nil {
		panic(err)
	}
	ex, err := exec.New(exec.Config{Backend: be, Queues: exec.Queues{Compute: ss.Compute, H2D: ss.H2D, D2H: ss.D2H},
		Cache: cache, Table: table}, prog)
	if err != nil {
		panic(err)
	}
	defer ex.Close()
	if err := ex.Run(context.Background(), prog, m, h); err != nil {
		panic(err)
	}
	g := math.Float32frombits(binary.LittleEndian.Uint32(h.g[2]))
	tr := ex.Traffic()
	fmt.Printf("layer 2's gradient: %v (one per micro-batch)\n", g)
	fmt.Printf("weights in: %d layers' worth, gradients out: %d layers' worth\n", tr.H2D/(4*N), tr.D2H/(4*N))
	fmt.Printf("device peak as compiled: %v\n", cache.Stats().PeakAllocated == peak)
	// Output:
	// layer 2's gradient: 3 (one per micro-batch)
	// weights in: 7 layers' worth, gradients out: 4 layers' worth
	// device peak as compiled: true
}
