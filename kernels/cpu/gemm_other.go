//go:build !amd64 || purego

package cpu

const useAVX2 = false

func kernel(k int, a, b, c []float32, ldc int) { kernelGo(k, a, b, c, ldc) }
