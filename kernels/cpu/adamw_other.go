//go:build !amd64 || purego

package cpu

func adamwStep(p, g, m, v []float32, c *adamConsts) { adamwGo(p, g, m, v, c) }
