package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// dtCase runs one op with its float operands in a chosen dtype. Inputs
// are exact in every dtype and arithmetic is float32 whatever the dtype,
// so each output in bf16/f16 must equal the f32 path's result rounded
// once: bit for bit.
type dtCase struct {
	name    string
	floats  [][]float32 // operands that take the dtype under test
	outs    []int       // which of floats are outputs
	f32s    [][]float32 // F32-only operands
	f32outs []int
	i32s    [][]int32
	run     func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor)
}

func dtCases() []dtCase {
	r := rand.New(rand.NewPCG(20, 21))
	rv := func(n int) []float32 { return randVals(r, n, 1) }
	const BT, C, OC, N = 7, 9, 19, 50
	const B, T, NH, V = 2, 3, 3, 11
	tok := []int32{3, 1, 3, 0, 10, 3}
	tg := []int32{3, -1, 0, 10, 2, 3, 7}
	return []dtCase{
		{name: "Fill", floats: [][]float32{rv(N)}, outs: []int{0},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) { be.Fill(q, f[0], 0.1) }},
		{name: "Cast", floats: [][]float32{rv(N), rv(N)}, outs: []int{0},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) { be.Cast(q, f[0], f[1]) }},
		{name: "Add", floats: [][]float32{rv(N), rv(N)}, outs: []int{0},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) { be.Add(q, f[0], f[1]) }},
		{name: "Scale", floats: [][]float32{rv(N)}, outs: []int{0},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) { be.Scale(q, f[0], 0.3) }},
		{name: "MatmulForward", floats: [][]float32{rv(BT * OC), rv(BT * C), rv(OC * C), rv(OC)}, outs: []int{0},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.MatmulForward(q, f[0], f[1], f[2], f[3], BT, C, OC)
			}},
		{name: "MatmulBackward", floats: [][]float32{rv(BT * C), rv(OC * C), rv(OC), rv(BT * OC), rv(BT * C), rv(OC * C)}, outs: []int{0, 1, 2},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.MatmulBackward(q, f[0], f[1], f[2], f[3], f[4], f[5], BT, C, OC)
			}},
		{name: "Encoder", floats: [][]float32{rv(B * T * C), rv(V * C), rv(T * C), rv(V * C), rv(T * C), rv(B * T * C)}, outs: []int{0, 3, 4},
			i32s: [][]int32{tok},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.EncoderForward(q, f[0], ii[0], f[1], f[2], B, T, C)
				be.EncoderBackward(q, f[3], f[4], f[5], ii[0], B, T, C)
			}},
		{name: "LayerNorm", floats: [][]float32{rv(BT * C), rv(BT * C), rv(C), rv(C), rv(BT * C), rv(C), rv(C), rv(BT * C)}, outs: []int{0, 4, 5, 6},
			f32s: [][]float32{make([]float32, BT), make([]float32, BT)}, f32outs: []int{0, 1},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.LayerNormForward(q, f[0], g[0], g[1], f[1], f[2], f[3], BT, C)
				be.LayerNormBackward(q, f[4], f[5], f[6], f[7], f[1], f[2], g[0], g[1], BT, C)
			}},
		{name: "Gelu", floats: [][]float32{rv(N), rv(N), rv(N), rv(N)}, outs: []int{0, 2},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.GeluForward(q, f[0], f[1], N)
				be.GeluBackward(q, f[2], f[1], f[3], N)
			}},
		{name: "Attention", floats: [][]float32{rv(B * T * C), rv(B * T * 3 * C), rv(B * T * 3 * C), rv(B * T * C)}, outs: []int{0, 2},
			f32s: [][]float32{make([]float32, B*NH*T)}, f32outs: []int{0},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.AttentionForward(q, f[0], g[0], f[1], B, T, C, NH)
				be.AttentionBackward(q, f[2], f[3], f[1], f[0], g[0], B, T, C, NH)
			}},
		{name: "CrossEntropy", floats: [][]float32{rv(BT * V), rv(BT * V)}, outs: []int{1},
			f32s: [][]float32{make([]float32, BT)}, f32outs: []int{0}, i32s: [][]int32{tg},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.CrossEntropyForward(q, g[0], f[0], ii[0], BT, V)
				be.CrossEntropyBackward(q, f[1], f[0], ii[0], BT, V, 0.25)
			}},
		{name: "MSE", floats: [][]float32{rv(N), rv(N)}, outs: []int{1},
			f32s: [][]float32{make([]float32, N), rv(N)}, f32outs: []int{0},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.MSEForward(q, g[0], f[0], g[1], N)
				be.MSEBackward(q, f[1], f[0], g[1], N, 0.5)
			}},
		{name: "AdamW", floats: [][]float32{rv(N), rv(N)}, outs: []int{1},
			f32s: [][]float32{rv(N), rv(N), make([]float32, N)}, f32outs: []int{0, 1, 2},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				p := kernels.AdamWParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, GradScale: 0.5}
				be.AdamW(q, g[0], f[0], g[1], g[2], f[1], p)
			}},
		{name: "SumSquaresFinite", floats: [][]float32{rv(N)},
			f32s: [][]float32{{1, 0}}, f32outs: []int{0},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) { be.SumSquaresFinite(q, g[0], f[0]) }},
	}
}

func roundTo(dt kernels.DType, x float32) float32 {
	switch dt {
	case kernels.BF16:
		return kernels.F32FromBF16(kernels.BF16FromF32(x))
	case kernels.F16:
		return kernels.F32FromF16(kernels.F16FromF32(x))
	}
	return x
}

func runDT(t *testing.T, c dtCase, dtOf func(i int) kernels.DType) (fl, f32 [][]float32) {
	be := openBE(t, 0)
	q := be.DefaultQueue()
	var f, g, ii []kernels.Tensor
	for i, v := range c.floats {
		f = append(f, upload(t, be, dtOf(i), v))
	}
	for _, v := range c.f32s {
		g = append(g, upload(t, be, kernels.F32, v))
	}
	for _, v := range c.i32s {
		ii = append(ii, uploadI32(t, be, v))
	}
	c.run(be, q, f, g, ii)
	syncQ(t, be)
	for _, i := range c.outs {
		fl = append(fl, download(t, be, f[i]))
	}
	for _, i := range c.f32outs {
		f32 = append(f32, download(t, be, g[i]))
	}
	return fl, f32
}

func TestDTypePathsRoundOnce(t *testing.T) { checkRoundOnce(t, dtCases()) }

// checkRoundOnce runs each case in f32, then in bf16 and f16 (all float
// operands, and every other one), and requires each output to be the f32
// result rounded once into its dtype.
func checkRoundOnce(t *testing.T, cases []dtCase) {
	for _, c := range cases {
		ref, ref32 := runDT(t, c, func(int) kernels.DType { return kernels.F32 })
		for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
			for _, mixed := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%v/mixed=%v", c.name, dt, mixed), func(t *testing.T) {
					dtOf := func(i int) kernels.DType {
						if mixed && i%2 == 1 {
							return kernels.F32
						}
						return dt
					}
					got, got32 := runDT(t, c, dtOf)
					for k, i := range c.outs {
						for j := range got[k] {
							want := roundTo(dtOf(i), ref[k][j])
							if math.Float32bits(got[k][j]) != math.Float32bits(want) {
								t.Fatalf("output %d[%d] = %v, want %v (f32 path %v rounded once to %v)", i, j, got[k][j], want, ref[k][j], dtOf(i))
							}
						}
					}
					for k := range got32 {
						for j := range got32[k] {
							if math.Float32bits(got32[k][j]) != math.Float32bits(ref32[k][j]) {
								t.Fatalf("f32 output %d[%d] = %v, want %v", c.f32outs[k], j, got32[k][j], ref32[k][j])
							}
						}
					}
				})
			}
		}
	}
}
