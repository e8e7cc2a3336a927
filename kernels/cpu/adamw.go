package cpu

import (
	"fmt"
	"math"

	"github.com/spill-ml/spill/kernels"
)

// This file holds the one AdamW implementation of the project's host code:
// Backend.AdamW (the CPU backend's kernel) and HostAdamW (the host
// optimizer of out-of-core placements, offload.HostAdamW) both run
// adamwBlock, which converts the gradient, runs adamwStep (the AVX kernel
// of adamw_amd64.s, or adamwGo) and rounds the compute copy, so the two
// give the same bits by construction.

// adamConsts are the per-step constants of the AdamW update, laid out for
// the assembly kernel.
type adamConsts struct {
	gs, b1, omb1, b2, omb2, ic1, ic2, lr, eps, wd float32
}

// newAdamConsts derives the constants of step p.Step (>= 1): a zero
// GradScale means 1, and the bias corrections are computed in float64 and
// rounded once.
func newAdamConsts(p kernels.AdamWParams) (adamConsts, error) {
	if p.Step < 1 {
		return adamConsts{}, fmt.Errorf("step %d, want >= 1 (1-based)", p.Step)
	}
	gs := p.GradScale
	if gs == 0 {
		gs = 1
	}
	return adamConsts{
		gs: gs, b1: p.Beta1, omb1: 1 - p.Beta1, b2: p.Beta2, omb2: 1 - p.Beta2,
		ic1: float32(1 / (1 - math.Pow(float64(p.Beta1), float64(p.Step)))),
		ic2: float32(1 / (1 - math.Pow(float64(p.Beta2), float64(p.Step)))),
		lr:  p.LR, eps: p.Eps, wd: p.WeightDecay,
	}, nil
}

// adamwGo applies one AdamW step to equal-length slices; the arithmetic
// (order and rounding) matches adamwAVX2 lane for lane.
func adamwGo(p, g, m, v []float32, c *adamConsts) {
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	for i := range p {
		gi := g[i] * c.gs
		mi := c.b1*m[i] + c.omb1*gi
		vi := c.b2*v[i] + c.omb2*(gi*gi)
		m[i], v[i] = mi, vi
		den := float32(math.Sqrt(float64(vi*c.ic2))) + c.eps
		upd := (mi*c.ic1)/den + c.wd*p[i]
		p[i] -= c.lr * upd
	}
}

// adamwFromGo is adamwGo out of place: the state is copied from p0, m0
// and v0 into p, m and v and updated there.
func adamwFromGo(p, g, m, v, p0, m0, v0 []float32, c *adamConsts) {
	copy(p, p0)
	copy(m, m0[:len(p)])
	copy(v, v0[:len(p)])
	adamwGo(p, g, m, v, c)
}

// adamwBlockFrom is adamwBlock out of place: the state of elements [lo,
// hi) is read from p0, m0 and v0 (adamwStepFrom); in place (adamwBlock)
// when p0 is nil.
func adamwBlockFrom(p, m, v, p0, m0, v0 []float32, g, o view, hasOut bool, lo, hi int, c *adamConsts, ga *[blk]float32) {
	if p0 == nil {
		adamwBlock(p, m, v, g, o, hasOut, lo, hi, c, ga)
		return
	}
	ps := p[lo:hi:hi]
	adamwStepFrom(ps, g.load(lo, hi, ga[:]), m[lo:hi:hi], v[lo:hi:hi], p0[lo:hi:hi], m0[lo:hi:hi], v0[lo:hi:hi], c)
	if hasOut {
		o.store(lo, ps)
	}
}

// adamwBlock updates elements [lo, hi) (at most blk of them, so that the
// converted gradient in ga and the block of every operand stay in L1):
// the gradient g is loaded as float32 (converted into ga unless it is
// F32), param p and the moments m and v are updated, and when hasOut the
// new parameters are rounded into o.
func adamwBlock(p, m, v []float32, g, o view, hasOut bool, lo, hi int, c *adamConsts, ga *[blk]float32) {
	ps := p[lo:hi:hi]
	adamwStep(ps, g.load(lo, hi, ga[:]), m[lo:hi:hi], v[lo:hi:hi], c)
	if hasOut {
		o.store(lo, ps)
	}
}
