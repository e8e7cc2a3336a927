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

// adamwFromAVX2 is adamwAVX2 out of place (from p0, m0, v0 into par,
// mom, vel); mom and vel must be 32-byte aligned.
//
//go:noescape
func adamwFromAVX2(par, grd, mom, vel, p0, m0, v0 *float32, n int, cst *adamConsts)

// adamwStepFrom is adamwStep out of place: the state is read from p0, m0
// and v0 and written to p, m and v.
func adamwStepFrom(p, g, m, v, p0, m0, v0 []float32, c *adamConsts) {
	n := len(p)
	g, m, v, p0, m0, v0 = g[:n], m[:n], v[:n], p0[:n], m0[:n], v0[:n]
	if useAVX2 && n >= 16 {
		// Up to the first element at which the moments are 32-byte
		// aligned (both or neither: the host buffers are aligned alike).
		a := 0
		for a < 7 && uintptr(unsafe.Pointer(&m[a]))%32 != 0 {
			a++
		}
		if uintptr(unsafe.Pointer(&m[a]))%32 == 0 && uintptr(unsafe.Pointer(&v[a]))%32 == 0 {
			adamwFromGo(p[:a], g[:a], m[:a], v[:a], p0[:a], m0[:a], v0[:a], c)
			k := (n - a) &^ 7
			adamwFromAVX2(&p[a], &g[a], &m[a], &v[a], &p0[a], &m0[a], &v0[a], k, c)
			a += k
			adamwFromGo(p[a:], g[a:], m[a:], v[a:], p0[a:], m0[a:], v0[a:], c)
			return
		}
	}
	adamwFromGo(p, g, m, v, p0, m0, v0, c)
}
