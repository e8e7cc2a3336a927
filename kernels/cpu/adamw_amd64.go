//go:build amd64 && !purego

package cpu

import "unsafe"

// adamwAVX2 updates n elements (a multiple of 8) with 8-lane AVX.
//
//go:noescape
func adamwAVX2(par, grd, mom, vel *float32, n int, cst *adamConsts)

func adamwStep(p, g, m, v []float32, c *adamConsts) {
	n := len(p)
	g, m, v = g[:n], m[:n], v[:n]
	if useAVX2 && n >= 8 {
		k := n &^ 7
		adamwAVX2(unsafe.SliceData(p), unsafe.SliceData(g), unsafe.SliceData(m), unsafe.SliceData(v), k, c)
		p, g, m, v = p[k:], g[k:], m[k:], v[k:]
	}
	adamwGo(p, g, m, v, c)
}
