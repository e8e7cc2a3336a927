package cpu

import "math"

// adamConsts are the per-step constants of the AdamW update, laid out for
// the assembly kernel.
type adamConsts struct {
	gs, b1, omb1, b2, omb2, ic1, ic2, lr, eps, wd float32
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
