//go:build cuda

package cuda

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/spill-ml/spill/kernels"
	_ "github.com/spill-ml/spill/kernels/cpu"
)

// pair runs every op on the CUDA backend and on the CPU reference.
type pair struct {
	t    *testing.T
	g, c kernels.Backend
	rng  *rand.Rand
	// nanOK lets check accept NaN where the reference has NaN; otherwise a
	// NaN in the reference (a poisoned output left unwritten) fails.
	nanOK bool
	// drained is set once the cleanups have waited for both queues.
	drained bool
}

// tp is one logical tensor on both backends.
type tp struct {
	g, c kernels.Tensor
}

func openPair(t *testing.T) *pair {
	t.Helper()
	g, err := kernels.Open("cuda", kernels.Config{MemoryLimit: 4 << 30})
	if err != nil {
		t.Fatalf("open cuda: %v", err)
	}
	c, err := kernels.Open("cpu", kernels.Config{})
	if err != nil {
		t.Fatalf("open cpu: %v", err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("cuda Close: %v", err)
		}
		_ = c.Close()
	})
	seed := rand.Uint64()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("random seed %d", seed)
		}
	})
	return &pair{t: t, g: g, c: c, rng: rand.New(rand.NewPCG(seed, 1))}
}

func encode(dt kernels.DType, vals []float32) []byte {
	f32 := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(v))
	}
	if dt == kernels.F32 {
		return f32
	}
	out := make([]byte, dt.Size()*len(vals))
	kernels.ConvertBytes(out, dt, f32, kernels.F32)
	return out
}

func decode(dt kernels.DType, b []byte) []float32 {
	n := len(b) / dt.Size()
	f32 := b
	if dt != kernels.F32 {
		f32 = make([]byte, 4*n)
		kernels.ConvertBytes(f32, kernels.F32, b, dt)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(f32[4*i:]))
	}
	return out
}

func (p *pair) alloc(dt kernels.DType, n int) tp {
	p.t.Helper()
	bytes := int64(n * dt.Size())
	gb, err := p.g.Alloc(bytes, "test")
	if err != nil {
		p.t.Fatal(err)
	}
	cb, err := p.c.Alloc(bytes, "test")
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() {
		// The contract of Free: no queued work may still use the buffer.
		// A test may end with work it never waited for (a last Zero), so
		// drain both queues before the first Free. Freeing under a pending
		// launch made that launch fail with InvalidValue, reported by Close.
		p.drain()
		p.g.Free(gb)
		p.c.Free(cb)
	})
	return tp{kernels.View(gb, 0, dt, n), kernels.View(cb, 0, dt, n)}
}

// upload makes a tensor holding vals (rounded to dt) on both backends.
func (p *pair) upload(dt kernels.DType, vals []float32) tp {
	x := p.alloc(dt, len(vals))
	b := encode(dt, vals)
	p.g.CopyToDevice(p.g.DefaultQueue(), x.g, b)
	p.c.CopyToDevice(p.c.DefaultQueue(), x.c, b)
	p.sync()
	return x
}

func (p *pair) ints(vals []int32) tp {
	x := p.alloc(kernels.I32, len(vals))
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	p.g.CopyToDevice(p.g.DefaultQueue(), x.g, b)
	p.c.CopyToDevice(p.c.DefaultQueue(), x.c, b)
	p.sync()
	return x
}

// random is upload of n uniform values in [-s, s).
func (p *pair) random(dt kernels.DType, n int, s float32) tp {
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = (2*p.rng.Float32() - 1) * s
	}
	return p.upload(dt, vals)
}

// poison is a tensor filled with NaN, for outputs that must be overwritten.
func (p *pair) poison(dt kernels.DType, n int) tp {
	x := p.alloc(dt, n)
	p.g.Fill(p.g.DefaultQueue(), x.g, float32(math.NaN()))
	p.c.Fill(p.c.DefaultQueue(), x.c, float32(math.NaN()))
	return x
}

// drain waits for both queues once, before the cleanups free buffers.
func (p *pair) drain() {
	if p.drained {
		return
	}
	p.drained = true
	ctx := context.Background()
	if err := p.g.DefaultQueue().Synchronize(ctx); err != nil {
		p.t.Errorf("cuda: draining before Free: %v", err)
	}
	if err := p.c.DefaultQueue().Synchronize(ctx); err != nil {
		p.t.Errorf("cpu: draining before Free: %v", err)
	}
}

func (p *pair) sync() {
	p.t.Helper()
	ctx := context.Background()
	if err := p.g.DefaultQueue().Synchronize(ctx); err != nil {
		p.t.Fatalf("cuda: %v", err)
	}
	if err := p.c.DefaultQueue().Synchronize(ctx); err != nil {
		p.t.Fatalf("cpu: %v", err)
	}
}

func (p *pair) download(x tp) (got, want []float32) {
	p.t.Helper()
	gb, cb := make([]byte, x.g.Bytes()), make([]byte, x.c.Bytes())
	p.g.CopyToHost(p.g.DefaultQueue(), gb, x.g)
	p.c.CopyToHost(p.c.DefaultQueue(), cb, x.c)
	p.sync()
	return decode(x.g.DType, gb), decode(x.c.DType, cb)
}

// tolerance for results of dtype dt: |got-want| <= tol + eps*|want|.
func tolerance(dt kernels.DType) (tol, eps float64) {
	switch dt {
	case kernels.BF16:
		return 2e-2, 1.6e-2
	case kernels.F16:
		return 3e-3, 3e-3
	}
	return 2e-4, 2e-4
}

// check compares x on both backends with the dtype's tolerance times slack.
func (p *pair) check(name string, x tp, slack float64) {
	p.t.Helper()
	got, want := p.download(x)
	tol, eps := tolerance(x.g.DType)
	tol, eps = tol*slack, eps*slack
	bad := 0
	var worst string
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(w) && !p.nanOK {
			p.t.Errorf("%s: reference element [%d] is NaN (output not written?)", name, i)
			return
		}
		ok := math.IsNaN(g) == math.IsNaN(w) && (math.IsNaN(w) || g == w || math.Abs(g-w) <= tol+eps*math.Abs(w))
		if !ok {
			if bad == 0 {
				worst = fmt.Sprintf("first at [%d]: cuda %g, cpu %g", i, g, w)
			}
			bad++
		}
	}
	if bad > 0 {
		p.t.Errorf("%s (%v, %d elements): %d mismatches; %s", name, x.g.DType, len(want), bad, worst)
	}
}

// both runs f on the CUDA and the CPU backend with the matching tensors.
func (p *pair) both(f func(b kernels.Backend, q kernels.Queue, pick func(tp) kernels.Tensor)) {
	f(p.g, p.g.DefaultQueue(), func(x tp) kernels.Tensor { return x.g })
	f(p.c, p.c.DefaultQueue(), func(x tp) kernels.Tensor { return x.c })
}

var floatTypes = []kernels.DType{kernels.F32, kernels.BF16, kernels.F16}
