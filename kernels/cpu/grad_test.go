package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// Float64 reference implementations.

func matmul64(x, w, b []float64, BT, C, OC int) []float64 {
	out := make([]float64, BT*OC)
	for r := 0; r < BT; r++ {
		for o := 0; o < OC; o++ {
			s := 0.0
			if b != nil {
				s = b[o]
			}
			for c := 0; c < C; c++ {
				s += x[r*C+c] * w[o*C+c]
			}
			out[r*OC+o] = s
		}
	}
	return out
}

func layernorm64(x, w, b []float64, N, C int) (out, mean, rstd []float64) {
	out, mean, rstd = make([]float64, N*C), make([]float64, N), make([]float64, N)
	for r := 0; r < N; r++ {
		row := x[r*C : r*C+C]
		m := 0.0
		for _, v := range row {
			m += v
		}
		m /= float64(C)
		vr := 0.0
		for _, v := range row {
			vr += (v - m) * (v - m)
		}
		s := 1 / math.Sqrt(vr/float64(C)+1e-5)
		for i, v := range row {
			out[r*C+i] = (v-m)*s*w[i] + b[i]
		}
		mean[r], rstd[r] = m, s
	}
	return
}

func gelu64(x []float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
	}
	return out
}

// attention64 is causal attention over qkv(B,T,3C): gqa64 with as many
// key/value heads as query heads.
func attention64(qkv []float64, B, T, C, NH int) (out, lse []float64) {
	return gqa64(qkv, B, T, NH, NH, C/NH)
}

func crossEntropy64(logits []float64, targets []int32, BT, V int) []float64 {
	out := make([]float64, BT)
	for r := 0; r < BT; r++ {
		if targets[r] < 0 {
			continue
		}
		z := logits[r*V : r*V+V]
		mx := math.Inf(-1)
		for _, v := range z {
			mx = math.Max(mx, v)
		}
		s := 0.0
		for _, v := range z {
			s += math.Exp(v - mx)
		}
		out[r] = mx + math.Log(s) - z[targets[r]]
	}
	return out
}

func TestMatmulGrad(t *testing.T) {
	for _, s := range []struct{ BT, C, OC int }{{5, 7, 3}, {13, 20, 17}, {7, 300, 9}, {80, 5, 20}} {
		t.Run(fmt.Sprintf("BT%d_C%d_OC%d", s.BT, s.C, s.OC), func(t *testing.T) {
			BT, C, OC := s.BT, s.C, s.OC
			be := openBE(t, 0)
			q := be.DefaultQueue()
			r := rand.New(rand.NewPCG(1, uint64(BT)))
			x, w, bias := randVals(r, BT*C, 1), randVals(r, OC*C, 0.5), randVals(r, OC, 0.5)
			dy := randVals(r, BT*OC, 1)
			tx, tw, tb, tdy := upload(t, be, kernels.F32, x), upload(t, be, kernels.F32, w), upload(t, be, kernels.F32, bias), upload(t, be, kernels.F32, dy)
			out := upload(t, be, kernels.F32, make([]float32, BT*OC))
			be.MatmulForward(q, out, tx, tw, tb, BT, C, OC)
			fwd := func(in [][]float64) []float64 { return matmul64(in[0], in[1], in[2], BT, C, OC) }
			ins := [][]float64{to64(x), to64(w), to64(bias)}
			checkClose(t, "out", download(t, be, out), fwd(ins))

			dx, dw, db := upload(t, be, kernels.F32, make([]float32, BT*C)), upload(t, be, kernels.F32, make([]float32, OC*C)), upload(t, be, kernels.F32, make([]float32, OC))
			be.MatmulBackward(q, dx, dw, db, tdy, tx, tw, BT, C, OC)
			once := [][]float32{download(t, be, dx), download(t, be, dw), download(t, be, db)}
			for i, name := range []string{"dinp", "dweight", "dbias"} {
				checkClose(t, name, once[i], numGrad(fwd, ins, to64(dy), i))
			}
			be.MatmulBackward(q, dx, dw, db, tdy, tx, tw, BT, C, OC)
			for i, tt := range []kernels.Tensor{dx, dw, db} {
				checkDoubled(t, fmt.Sprint("grad ", i), once[i], download(t, be, tt))
			}
		})
	}
}

func TestMatmulLargeAgainstNaive(t *testing.T) {
	// Shapes that cross every blocking boundary (mc, kc, nc) with ragged edges.
	for _, s := range []struct{ BT, C, OC int }{{150, 530, 37}, {3, 4, 3100}, {73, 257, 33}} {
		be := openBE(t, 0)
		r := rand.New(rand.NewPCG(2, uint64(s.C)))
		x, w := randVals(r, s.BT*s.C, 1), randVals(r, s.OC*s.C, 1)
		out := upload(t, be, kernels.F32, make([]float32, s.BT*s.OC))
		be.MatmulForward(be.DefaultQueue(), out, upload(t, be, kernels.F32, x), upload(t, be, kernels.F32, w), kernels.Tensor{}, s.BT, s.C, s.OC)
		checkClose(t, fmt.Sprint("out ", s), download(t, be, out), matmul64(to64(x), to64(w), nil, s.BT, s.C, s.OC))
	}
}

func TestKernelAsmMatchesGo(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA micro-kernel on this machine")
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, k := range []int{1, 2, 7, 256} {
		a, b := randVals(r, k*mr, 1), randVals(r, k*nr, 1)
		ldc := nr + 3
		c0 := randVals(r, mr*ldc, 1)
		c1 := append([]float32(nil), c0...)
		c2 := append([]float32(nil), c0...)
		kernel(k, a, b, c1, ldc)
		kernelGo(k, a, b, c2, ldc)
		for i := range c1 {
			if i%ldc >= nr {
				if c1[i] != c0[i] {
					t.Fatalf("k=%d: kernel wrote outside its tile at %d", k, i)
				}
				continue
			}
			if d := math.Abs(float64(c1[i] - c2[i])); d > 1e-4*math.Max(1, math.Abs(float64(c2[i]))) {
				t.Fatalf("k=%d: asm %v vs go %v at %d", k, c1[i], c2[i], i)
			}
		}
	}
}

func TestLayerNormGrad(t *testing.T) {
	for _, s := range []struct{ N, C int }{{3, 7}, {4, 33}, {9, 1}} {
		t.Run(fmt.Sprintf("N%d_C%d", s.N, s.C), func(t *testing.T) {
			N, C := s.N, s.C
			be := openBE(t, 0)
			q := be.DefaultQueue()
			r := rand.New(rand.NewPCG(5, uint64(C)))
			x, w, b, dy := randVals(r, N*C, 1), randVals(r, C, 1), randVals(r, C, 1), randVals(r, N*C, 1)
			tx, tw, tb := upload(t, be, kernels.F32, x), upload(t, be, kernels.F32, w), upload(t, be, kernels.F32, b)
			out, mean, rstd := upload(t, be, kernels.F32, make([]float32, N*C)), upload(t, be, kernels.F32, make([]float32, N)), upload(t, be, kernels.F32, make([]float32, N))
			be.LayerNormForward(q, out, mean, rstd, tx, tw, tb, N, C)
			ins := [][]float64{to64(x), to64(w), to64(b)}
			fwd := func(in [][]float64) []float64 { o, _, _ := layernorm64(in[0], in[1], in[2], N, C); return o }
			o64, m64, r64 := layernorm64(ins[0], ins[1], ins[2], N, C)
			checkClose(t, "out", download(t, be, out), o64)
			checkClose(t, "mean", download(t, be, mean), m64)
			if C > 1 { // C=1 has variance 0: rstd = 1/sqrt(eps), compared anyway below with looser scale
				checkClose(t, "rstd", download(t, be, rstd), r64)
			}
			dx, dw, db := upload(t, be, kernels.F32, make([]float32, N*C)), upload(t, be, kernels.F32, make([]float32, C)), upload(t, be, kernels.F32, make([]float32, C))
			tdy := upload(t, be, kernels.F32, dy)
			be.LayerNormBackward(q, dx, dw, db, tdy, tx, tw, mean, rstd, N, C)
			once := [][]float32{download(t, be, dx), download(t, be, dw), download(t, be, db)}
			if C > 1 {
				for i, name := range []string{"dinp", "dweight", "dbias"} {
					checkClose(t, name, once[i], numGrad(fwd, ins, to64(dy), i))
				}
			}
			be.LayerNormBackward(q, dx, dw, db, tdy, tx, tw, mean, rstd, N, C)
			for i, tt := range []kernels.Tensor{dx, dw, db} {
				checkDoubled(t, fmt.Sprint("grad ", i), once[i], download(t, be, tt))
			}
		})
	}
}

func TestGeluGrad(t *testing.T) {
	const N = 37
	be := openBE(t, 0)
	q := be.DefaultQueue()
	r := rand.New(rand.NewPCG(6, 7))
	x, dy := randVals(r, N, 2), randVals(r, N, 1)
	tx, tdy := upload(t, be, kernels.F32, x), upload(t, be, kernels.F32, dy)
	out, dx := upload(t, be, kernels.F32, make([]float32, N)), upload(t, be, kernels.F32, make([]float32, N))
	be.GeluForward(q, out, tx, N)
	fwd := func(in [][]float64) []float64 { return gelu64(in[0]) }
	ins := [][]float64{to64(x)}
	checkClose(t, "out", download(t, be, out), fwd(ins))
	be.GeluBackward(q, dx, tx, tdy, N)
	once := download(t, be, dx)
	checkClose(t, "dinp", once, numGrad(fwd, ins, to64(dy), 0))
	be.GeluBackward(q, dx, tx, tdy, N)
	checkDoubled(t, "dinp", once, download(t, be, dx))
}

func TestAttentionGrad(t *testing.T) {
	for _, s := range []struct{ B, T, C, NH int }{{1, 5, 7, 1}, {2, 5, 6, 2}, {2, 4, 12, 3}, {1, 1, 4, 2}} {
		t.Run(fmt.Sprintf("B%d_T%d_C%d_NH%d", s.B, s.T, s.C, s.NH), func(t *testing.T) {
			B, T, C, NH := s.B, s.T, s.C, s.NH
			be := openBE(t, 0)
			q := be.DefaultQueue()
			r := rand.New(rand.NewPCG(8, uint64(C*T)))
			x, dy := randVals(r, B*T*3*C, 1), randVals(r, B*T*C, 1)
			tx, tdy := upload(t, be, kernels.F32, x), upload(t, be, kernels.F32, dy)
			out, lse := upload(t, be, kernels.F32, make([]float32, B*T*C)), upload(t, be, kernels.F32, make([]float32, B*NH*T))
			be.AttentionForward(q, out, lse, tx, B, T, C, NH)
			ins := [][]float64{to64(x)}
			o64, l64 := attention64(ins[0], B, T, C, NH)
			checkClose(t, "out", download(t, be, out), o64)
			checkClose(t, "lse", download(t, be, lse), l64)
			fwd := func(in [][]float64) []float64 { o, _ := attention64(in[0], B, T, C, NH); return o }
			dx := upload(t, be, kernels.F32, make([]float32, B*T*3*C))
			be.AttentionBackward(q, dx, tdy, tx, out, lse, B, T, C, NH)
			once := download(t, be, dx)
			checkClose(t, "dqkv", once, numGrad(fwd, ins, to64(dy), 0))
			be.AttentionBackward(q, dx, tdy, tx, out, lse, B, T, C, NH)
			checkDoubled(t, "dqkv", once, download(t, be, dx))
		})
	}
}

func TestCrossEntropyGrad(t *testing.T) {
	for _, s := range []struct{ BT, V int }{{5, 7}, {6, 11}, {2, 1}} {
		t.Run(fmt.Sprintf("BT%d_V%d", s.BT, s.V), func(t *testing.T) {
			BT, V := s.BT, s.V
			be := openBE(t, 0)
			q := be.DefaultQueue()
			r := rand.New(rand.NewPCG(9, uint64(V)))
			z := randVals(r, BT*V, 2)
			tg := make([]int32, BT)
			for i := range tg {
				tg[i] = int32(r.IntN(V))
			}
			tg[BT-1] = -1 // ignored
			tz, ttg := upload(t, be, kernels.F32, z), uploadI32(t, be, tg)
			losses := upload(t, be, kernels.F32, make([]float32, BT))
			be.CrossEntropyForward(q, losses, tz, ttg, BT, V)
			fwd := func(in [][]float64) []float64 { return crossEntropy64(in[0], tg, BT, V) }
			ins := [][]float64{to64(z)}
			got := download(t, be, losses)
			checkClose(t, "losses", got, fwd(ins))
			if got[BT-1] != 0 {
				t.Fatalf("ignored target has loss %v", got[BT-1])
			}
			const scale = 0.37
			dz := upload(t, be, kernels.F32, make([]float32, BT*V))
			be.CrossEntropyBackward(q, dz, tz, ttg, BT, V, scale)
			once := download(t, be, dz)
			dl := make([]float64, BT)
			for i := range dl {
				dl[i] = scale
			}
			checkClose(t, "dlogits", once, numGrad(fwd, ins, dl, 0))
			be.CrossEntropyBackward(q, dz, tz, ttg, BT, V, scale)
			checkDoubled(t, "dlogits", once, download(t, be, dz))
		})
	}
}

func TestMSEGrad(t *testing.T) {
	const N = 9
	be := openBE(t, 0)
	q := be.DefaultQueue()
	r := rand.New(rand.NewPCG(10, 11))
	p, tg := randVals(r, N, 1), randVals(r, N, 1)
	tp, ttg := upload(t, be, kernels.F32, p), upload(t, be, kernels.F32, tg)
	losses, dp := upload(t, be, kernels.F32, make([]float32, N)), upload(t, be, kernels.F32, make([]float32, N))
	fwd := func(in [][]float64) []float64 {
		o := make([]float64, N)
		for i := range o {
			d := in[0][i] - float64(tg[i])
			o[i] = d * d / 2
		}
		return o
	}
	ins := [][]float64{to64(p)}
	be.MSEForward(q, losses, tp, ttg, N)
	checkClose(t, "losses", download(t, be, losses), fwd(ins))
	be.MSEBackward(q, dp, tp, ttg, N, 0.5)
	once := download(t, be, dp)
	dl := make([]float64, N)
	for i := range dl {
		dl[i] = 0.5
	}
	checkClose(t, "dpred", once, numGrad(fwd, ins, dl, 0))
	be.MSEBackward(q, dp, tp, ttg, N, 0.5)
	checkDoubled(t, "dpred", once, download(t, be, dp))
}

func TestEncoderGrad(t *testing.T) {
	const B, T, C, V, maxT = 2, 3, 5, 4, 4
	be := openBE(t, 0)
	q := be.DefaultQueue()
	r := rand.New(rand.NewPCG(12, 13))
	wte, wpe, dy := randVals(r, V*C, 1), randVals(r, maxT*C, 1), randVals(r, B*T*C, 1)
	tok := []int32{1, 3, 1, 0, 1, 3} // repeated ids; id 2 unused
	tt := uploadI32(t, be, tok)
	twte, twpe := upload(t, be, kernels.F32, wte), upload(t, be, kernels.F32, wpe)
	out := upload(t, be, kernels.F32, make([]float32, B*T*C))
	be.EncoderForward(q, out, tt, twte, twpe, B, T, C)
	fwd := func(in [][]float64) []float64 {
		o := make([]float64, B*T*C)
		for bt := 0; bt < B*T; bt++ {
			for c := 0; c < C; c++ {
				o[bt*C+c] = in[0][int(tok[bt])*C+c] + in[1][(bt%T)*C+c]
			}
		}
		return o
	}
	ins := [][]float64{to64(wte), to64(wpe)}
	checkClose(t, "out", download(t, be, out), fwd(ins))
	dwte, dwpe := upload(t, be, kernels.F32, make([]float32, V*C)), upload(t, be, kernels.F32, make([]float32, maxT*C))
	tdy := upload(t, be, kernels.F32, dy)
	be.EncoderBackward(q, dwte, dwpe, tdy, tt, B, T, C)
	once := [][]float32{download(t, be, dwte), download(t, be, dwpe)}
	checkClose(t, "dwte", once[0], numGrad(fwd, ins, to64(dy), 0))
	checkClose(t, "dwpe", once[1], numGrad(fwd, ins, to64(dy), 1))
	be.EncoderBackward(q, dwte, dwpe, tdy, tt, B, T, C)
	checkDoubled(t, "dwte", once[0], download(t, be, dwte))
	checkDoubled(t, "dwpe", once[1], download(t, be, dwpe))
}
