//go:build !amd64 || purego

package cpu

func adamwStep(p, g, m, v []float32, c *adamConsts) { adamwGo(p, g, m, v, c) }

func adamwStepFrom(p, g, m, v, p0, m0, v0 []float32, c *adamConsts) {
	adamwFromGo(p, g, m, v, p0, m0, v0, c)
}
