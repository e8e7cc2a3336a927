package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

func TestElementwiseOps(t *testing.T) {
	const N = 40000 // several parallel chunks
	be := openBE(t, 0)
	q := be.DefaultQueue()
	r := rand.New(rand.NewPCG(30, 31))
	x, y := randVals(r, N, 1), randVals(r, N, 1)
	tx, ty := upload(t, be, kernels.F32, x), upload(t, be, kernels.F32, y)
	be.Add(q, tx, ty)
	be.Scale(q, tx, -0.5)
	got := download(t, be, tx)
	for i := range got {
		if want := (x[i] + y[i]) * -0.5; got[i] != want {
			t.Fatalf("Add+Scale[%d] = %v, want %v", i, got[i], want)
		}
	}
	h := upload(t, be, kernels.BF16, make([]float32, N))
	be.Cast(q, h, tx)
	be.Fill(q, tx.Slice(10, 5), 3.14159)
	gh, gx := download(t, be, h), download(t, be, tx)
	for i := range gh {
		if gh[i] != roundTo(kernels.BF16, got[i]) {
			t.Fatalf("Cast[%d] = %v, want %v", i, gh[i], roundTo(kernels.BF16, got[i]))
		}
		want := got[i]
		if i >= 10 && i < 15 {
			want = 3.14159
		}
		if gx[i] != want {
			t.Fatalf("Fill of a slice: [%d] = %v, want %v", i, gx[i], want)
		}
	}
	be.Zero(q, h)
	for i, v := range download(t, be, h) {
		if v != 0 {
			t.Fatalf("Zero left %v at %d", v, i)
		}
	}
}

func TestCastSpecialValues(t *testing.T) {
	be := openBE(t, 0)
	q := be.DefaultQueue()
	inf := float32(math.Inf(1))
	vals := []float32{float32(math.NaN()), inf, -inf, 1e6, 1e-7, -0.0, 65504}
	src := upload(t, be, kernels.F32, vals)
	f16 := upload(t, be, kernels.F16, make([]float32, len(vals)))
	be.Cast(q, f16, src)
	got := download(t, be, f16)
	if !math.IsNaN(float64(got[0])) || got[1] != inf || got[2] != -inf || got[3] != inf || got[6] != 65504 {
		t.Fatalf("Cast to f16 of %v = %v", vals, got)
	}
	if want := kernels.F32FromF16(kernels.F16FromF32(1e-7)); got[4] != want || want == 0 {
		t.Fatalf("Cast to f16 of 1e-7 = %v, want subnormal %v", got[4], want)
	}
}

func TestAdamWAgainstFloat64(t *testing.T) {
	const N = 20001
	for _, gdt := range []kernels.DType{kernels.F32, kernels.BF16} {
		be := openBE(t, 0)
		q := be.DefaultQueue()
		r := rand.New(rand.NewPCG(32, 33))
		p0, g := randVals(r, N, 1), randVals(r, N, 1)
		param, grad := upload(t, be, kernels.F32, p0), upload(t, be, gdt, g)
		m, v := upload(t, be, kernels.F32, make([]float32, N)), upload(t, be, kernels.F32, make([]float32, N))
		out := upload(t, be, kernels.BF16, make([]float32, N))
		hp := kernels.AdamWParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradScale: 0.5}
		p64, m64, v64 := to64(p0), make([]float64, N), make([]float64, N)
		for step := 1; step <= 3; step++ {
			hp.Step = step
			be.AdamW(q, param, grad, m, v, out, hp)
			b1, b2 := float64(hp.Beta1), float64(hp.Beta2)
			for i := range p64 {
				gi := float64(g[i]) * 0.5
				m64[i] = b1*m64[i] + (1-b1)*gi
				v64[i] = b2*v64[i] + (1-b2)*gi*gi
				mh, vh := m64[i]/(1-math.Pow(b1, float64(step))), v64[i]/(1-math.Pow(b2, float64(step)))
				p64[i] -= float64(hp.LR) * (mh/(math.Sqrt(vh)+float64(hp.Eps)) + float64(hp.WeightDecay)*p64[i])
			}
		}
		gp := download(t, be, param)
		checkClose(t, "param", gp, p64)
		checkClose(t, "m", download(t, be, m), m64)
		checkClose(t, "v", download(t, be, v), v64)
		for i, o := range download(t, be, out) {
			if o != roundTo(kernels.BF16, gp[i]) {
				t.Fatalf("out[%d] = %v, want bf16(%v)", i, o, gp[i])
			}
		}
	}
}

// TestSumSquaresFinite: the sum of squares accumulates into out[0] with a
// relative error under 1e-5; out[1] is set by a NaN or Inf anywhere (in a
// block's middle or its tail), by an f16 overflow from a cast, never by
// finite data, and never cleared.
func TestSumSquaresFinite(t *testing.T) {
	const N = 100003
	be := openBE(t, 0)
	q := be.DefaultQueue()
	r := rand.New(rand.NewPCG(34, 35))
	x := randVals(r, N, 1)
	want := 2.0 // initial value of out[0]: it accumulates
	for _, v := range x {
		want += float64(v) * float64(v)
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		tx := upload(t, be, dt, x)
		out := upload(t, be, kernels.F32, []float32{2, 0})
		be.SumSquaresFinite(q, out, tx)
		got := download(t, be, out)
		if math.Abs(float64(got[0])-want) > 1e-5*want {
			t.Fatalf("%v sum of squares = %v, want %v", dt, got[0], want)
		}
		if got[1] != 0 {
			t.Fatalf("%v: flag set on finite data", dt)
		}
		for _, at := range []int{N - 7, 1500} {
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
				y := append([]float32(nil), x...)
				y[at] = bad
				be.SumSquaresFinite(q, out, upload(t, be, dt, y))
				if f := download(t, be, out)[1]; f != 1 {
					t.Fatalf("%v: missed %v at %d", dt, bad, at)
				}
				be.SumSquaresFinite(q, out, tx) // never clears
				if f := download(t, be, out)[1]; f != 1 {
					t.Fatalf("%v: finite data cleared the flag", dt)
				}
				be.Zero(q, out)
			}
		}
	}
	// A square past float32's range is not a non-finite element.
	huge := upload(t, be, kernels.F32, []float32{1, 3e30})
	out := upload(t, be, kernels.F32, []float32{0, 0})
	be.SumSquaresFinite(q, out, huge)
	if got := download(t, be, out); got[1] != 0 || !math.IsInf(float64(got[0]), 1) {
		t.Fatalf("finite 3e30: got sum %v flag %v, want +Inf and 0", got[0], got[1])
	}
	// f16 overflow from a cast is caught.
	big := upload(t, be, kernels.F32, []float32{1, 70000})
	h := upload(t, be, kernels.F16, make([]float32, 2))
	be.Cast(q, h, big)
	be.Zero(q, out)
	be.SumSquaresFinite(q, out, h)
	if download(t, be, out)[1] != 1 {
		t.Fatal("missed an f16 overflow to Inf")
	}
}

func TestBadOperandsPanicAtEnqueue(t *testing.T) {
	be := openBE(t, 0)
	q := be.DefaultQueue()
	small := upload(t, be, kernels.F32, make([]float32, 4))
	ids := uploadI32(t, be, []int32{0, 1})
	cases := map[string]func(){
		"short out":    func() { be.GeluForward(q, small, small, 5) },
		"int as float": func() { be.Scale(q, ids, 2) },
		"bf16 lse": func() {
			be.AttentionForward(q, small, upload(t, be, kernels.BF16, make([]float32, 4)), small, 1, 1, 1, 1)
		},
		"C % NH":          func() { be.AttentionForward(q, small, small, small, 1, 1, 3, 2) },
		"cast mismatch":   func() { be.Cast(q, small, small.Slice(0, 3)) },
		"zero dimension":  func() { be.MatmulForward(q, small, small, small, kernels.Tensor{}, 0, 1, 1) },
		"float as tokens": func() { be.EncoderForward(q, small, small, small, small, 1, 1, 1) },
	}
	for name, f := range cases {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: did not panic", name)
				}
			}()
			f()
		}()
	}
}

func TestAdamWKernelMatchesGo(t *testing.T) {
	r := rand.New(rand.NewPCG(36, 37))
	const n = 203 // vector body plus a scalar tail
	c := &adamConsts{gs: 0.5, b1: 0.9, omb1: 1 - float32(0.9), b2: 0.95, omb2: 1 - float32(0.95), ic1: 3.1, ic2: 7.3, lr: 1e-2, eps: 1e-8, wd: 0.1}
	p, g, m, v := randVals(r, n, 1), randVals(r, n, 1), randVals(r, n, 0.1), randVals(r, n, 0.1)
	for i := range v {
		v[i] = v[i] * v[i]
	}
	p2, m2, v2 := append([]float32(nil), p...), append([]float32(nil), m...), append([]float32(nil), v...)
	adamwStep(p, g, m, v, c)
	adamwGo(p2, g, m2, v2, c)
	for i := range p {
		if p[i] != p2[i] || m[i] != m2[i] || v[i] != v2[i] {
			t.Fatalf("element %d: kernel (%v %v %v) vs Go (%v %v %v)", i, p[i], m[i], v[i], p2[i], m2[i], v2[i])
		}
	}
}
