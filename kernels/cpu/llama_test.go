package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// Tests of the Llama kernels (kernels.LlamaOps): each op against a
// float64 reference on random inputs, in every float dtype, with outputs
// poisoned (NaN) before the run; every backward against central finite
// differences of the float64 forward, starting from non-zero gradients so
// that accumulation is checked too.

var floatDTypes = []kernels.DType{kernels.F32, kernels.BF16, kernels.F16}

// Float64 references.

func rmsnorm64(x, w []float64, N, C int, eps float64) (out, rstd []float64) {
	out, rstd = make([]float64, N*C), make([]float64, N)
	for r := 0; r < N; r++ {
		row := x[r*C : r*C+C]
		ss := 0.0
		for _, v := range row {
			ss += v * v
		}
		s := 1 / math.Sqrt(ss/float64(C)+eps)
		for i, v := range row {
			out[r*C+i] = v * s * w[i]
		}
		rstd[r] = s
	}
	return
}

// rmsnormGrad64 is the analytic gradient of Σ dy·rmsnorm(x, w): with
// n = x·rstd, dx = rstd·(w·dy - n·mean(w·dy·n)) and dw = Σ_rows dy·n. The
// tests check it against finite differences on small shapes and use it
// on shapes too large for them.
func rmsnormGrad64(x, w, dy []float64, N, C int, eps float64) (dx, dw []float64) {
	_, rstd := rmsnorm64(x, w, N, C, eps)
	dx, dw = make([]float64, N*C), make([]float64, C)
	for r := 0; r < N; r++ {
		s, m := rstd[r], 0.0
		for i := 0; i < C; i++ {
			m += w[i] * dy[r*C+i] * x[r*C+i] * s
		}
		m /= float64(C)
		for i := 0; i < C; i++ {
			n := x[r*C+i] * s
			dx[r*C+i] = s * (w[i]*dy[r*C+i] - n*m)
			dw[i] += dy[r*C+i] * n
		}
	}
	return
}

func swiglu64(g, u []float64) []float64 {
	out := make([]float64, len(g))
	for i := range g {
		out[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
	}
	return out
}

// rope64 rotates the query and key heads of each token row of x by the
// table row of its position (pairs i, i+hs/2) and copies the value heads.
func rope64(x, tab []float64, B, T, NH, NKV, hs int) []float64 {
	W := (NH + 2*NKV) * hs
	half := hs / 2
	out := append([]float64(nil), x...)
	for bt := 0; bt < B*T; bt++ {
		cs := tab[(bt%T)*hs:]
		for h := 0; h < NH+NKV; h++ {
			v := x[bt*W+h*hs:][:hs]
			o := out[bt*W+h*hs:][:hs]
			for i := 0; i < half; i++ {
				c, s := cs[i], cs[half+i]
				o[i] = v[i]*c - v[i+half]*s
				o[i+half] = v[i+half]*c + v[i]*s
			}
		}
	}
	return out
}

// gqa64 is causal attention over qkv(B,T,(NH+2·NKV)·hs), query head h
// using key/value head h/(NH/NKV).
func gqa64(qkv []float64, B, T, NH, NKV, hs int) (out, lse []float64) {
	W, C, rep := (NH+2*NKV)*hs, NH*hs, NH/NKV
	out, lse = make([]float64, B*T*C), make([]float64, B*NH*T)
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			kv := h / rep
			for t := 0; t < T; t++ {
				q := qkv[(b*T+t)*W+h*hs:][:hs]
				s := make([]float64, t+1)
				mx := math.Inf(-1)
				for t2 := 0; t2 <= t; t2++ {
					k := qkv[(b*T+t2)*W+NH*hs+kv*hs:][:hs]
					d := 0.0
					for i := range q {
						d += q[i] * k[i]
					}
					s[t2] = d / math.Sqrt(float64(hs))
					mx = math.Max(mx, s[t2])
				}
				sum := 0.0
				for t2 := range s {
					s[t2] = math.Exp(s[t2] - mx)
					sum += s[t2]
				}
				lse[(b*NH+h)*T+t] = mx + math.Log(sum)
				for t2 := range s {
					v := qkv[(b*T+t2)*W+(NH+NKV)*hs+kv*hs:][:hs]
					for i := range v {
						out[(b*T+t)*C+h*hs+i] += s[t2] / sum * v[i]
					}
				}
			}
		}
	}
	return
}

// Helpers.

func nans(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	return out
}

func f32s64(xs []float64) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x)
	}
	return out
}

func plus(a []float32, b []float64) []float64 {
	out := make([]float64, len(b))
	for i := range b {
		out[i] = float64(a[i]) + b[i]
	}
	return out
}

// checkTol checks every element of got against the float64 reference
// within tol + |ref|·eps, where eps is dt's unit roundoff (the one
// rounding into the output) plus 2e-5 for float32 arithmetic, and tol is
// 2e-5 of the reference's largest magnitude (for values that cancel).
func checkTol(t testing.TB, what string, dt kernels.DType, got []float32, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	eps := 2e-5
	switch dt {
	case kernels.BF16:
		eps += 1.0 / 256
	case kernels.F16:
		eps += 1.0 / 2048
	}
	maxAbs := 0.0
	for _, w := range want {
		maxAbs = math.Max(maxAbs, math.Abs(w))
	}
	tol := 2e-5 * (maxAbs + 1e-3)
	bad := 0
	for i := range got {
		g, w := float64(got[i]), want[i]
		if !(math.Abs(g-w) <= tol+math.Abs(w)*eps) {
			bad++
			if bad <= 5 {
				t.Errorf("%s[%d] = %v, want %v (±%.3g)", what, i, g, w, tol+math.Abs(w)*eps)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d values differ", what, bad, len(got))
	}
}

func checkBitwise(t testing.TB, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v, want exactly %v", what, i, got[i], want[i])
		}
	}
}

func mustPanic(t *testing.T, what, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("%s did not panic", what)
		}
		if !strings.Contains(fmt.Sprint(r), want) {
			t.Fatalf("%s panicked with %q, want it to mention %q", what, r, want)
		}
	}()
	f()
}

func TestRMSNorm(t *testing.T) {
	const eps = 1e-5
	// 67×515 runs in several parallel chunks, forward and backward; it
	// is checked against the analytic gradient only (finite differences
	// of every input would take minutes).
	for _, s := range []struct{ N, C int }{{1, 1}, {3, 7}, {5, 33}, {9, 300}, {67, 515}} {
		for _, dt := range floatDTypes {
			t.Run(fmt.Sprintf("N%d_C%d/%v", s.N, s.C, dt), func(t *testing.T) {
				N, C := s.N, s.C
				be := openBE(t, 0)
				q := be.DefaultQueue()
				r := rand.New(rand.NewPCG(40, uint64(N*C)))
				x, w, dy := randVals(r, N*C, 1), randVals(r, C, 1), randVals(r, N*C, 1)
				dx0, dw0 := randVals(r, N*C, 1), randVals(r, C, 1)
				tx, tw, tdy := upload(t, be, dt, x), upload(t, be, dt, w), upload(t, be, dt, dy)
				out, rstd := upload(t, be, dt, nans(N*C)), upload(t, be, kernels.F32, nans(N))
				be.RMSNormForward(q, out, rstd, tx, tw, N, C, eps)
				ins := [][]float64{to64(x), to64(w)}
				o64, r64 := rmsnorm64(ins[0], ins[1], N, C, eps)
				checkTol(t, "out", dt, download(t, be, out), o64)
				checkTol(t, "rstd", kernels.F32, download(t, be, rstd), r64)

				gx, gw := rmsnormGrad64(ins[0], ins[1], to64(dy), N, C, eps)
				if N*C < 10000 {
					fwd := func(in [][]float64) []float64 { o, _ := rmsnorm64(in[0], in[1], N, C, eps); return o }
					checkTol(t, "analytic dinp vs finite differences", kernels.F32, f32s64(gx), numGrad(fwd, ins, to64(dy), 0))
					checkTol(t, "analytic dweight vs finite differences", kernels.F32, f32s64(gw), numGrad(fwd, ins, to64(dy), 1))
				}
				dx, dw := upload(t, be, dt, dx0), upload(t, be, dt, dw0)
				be.RMSNormBackward(q, dx, dw, tdy, tx, tw, rstd, N, C)
				checkTol(t, "dinp", dt, download(t, be, dx), plus(dx0, gx))
				dw1 := download(t, be, dw)
				checkTol(t, "dweight", dt, dw1, plus(dw0, gw))
				// Without dinp: dweight accumulates once more.
				be.RMSNormBackward(q, kernels.Tensor{}, dw, tdy, tx, tw, rstd, N, C)
				checkTol(t, "dweight (no dinp)", dt, download(t, be, dw), plus(dw1, gw))
			})
		}
	}
}

func TestSwiGLU(t *testing.T) {
	for _, N := range []int{1, 37, 1025, 40000} {
		for _, dt := range floatDTypes {
			t.Run(fmt.Sprintf("N%d/%v", N, dt), func(t *testing.T) {
				be := openBE(t, 0)
				q := be.DefaultQueue()
				r := rand.New(rand.NewPCG(41, uint64(N)))
				g, u, dy := randVals(r, N, 3), randVals(r, N, 1), randVals(r, N, 1)
				dg0, du0 := randVals(r, N, 1), randVals(r, N, 1)
				if N > 2 {
					g[0], g[1] = -90, 90 // saturated sigmoid both ways
				}
				tg, tu, tdy := upload(t, be, dt, g), upload(t, be, dt, u), upload(t, be, dt, dy)
				out := upload(t, be, dt, nans(N))
				be.SwiGLUForward(q, out, tg, tu, N)
				g64, u64 := to64(g), to64(u)
				checkTol(t, "out", dt, download(t, be, out), swiglu64(g64, u64))

				// Central differences element by element (the op is
				// elementwise, so this is the whole gradient).
				f := func(g, u float64) float64 { return g / (1 + math.Exp(-g)) * u }
				wg, wu := make([]float64, N), make([]float64, N)
				for i := range wg {
					h := 1e-6 * math.Max(1, math.Abs(g64[i]))
					wg[i] = float64(dg0[i]) + float64(dy[i])*(f(g64[i]+h, u64[i])-f(g64[i]-h, u64[i]))/(2*h)
					h = 1e-6 * math.Max(1, math.Abs(u64[i]))
					wu[i] = float64(du0[i]) + float64(dy[i])*(f(g64[i], u64[i]+h)-f(g64[i], u64[i]-h))/(2*h)
				}
				dg, du := upload(t, be, dt, dg0), upload(t, be, dt, du0)
				be.SwiGLUBackward(q, dg, du, tdy, tg, tu, N)
				checkTol(t, "dgate", dt, download(t, be, dg), wg)
				checkTol(t, "dup", dt, download(t, be, du), wu)
			})
		}
	}
}

type ropeShape struct{ B, T, NH, NKV, hs int }

var ropeConfigs = []struct {
	name string
	cfg  kernels.RoPEConfig
}{
	{"theta1e4", kernels.RoPEConfig{Theta: 10000}},
	// A short original context puts the pairs of small heads in all
	// three bands of the llama3 scaling.
	{"llama3", kernels.RoPEConfig{Theta: 500000, Scaling: kernels.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64}}},
}

func TestRoPE(t *testing.T) {
	// The last shape runs in several parallel chunks of rows.
	shapes := []ropeShape{{1, 1, 1, 1, 2}, {2, 5, 4, 2, 6}, {1, 7, 3, 1, 10}, {2, 3, 2, 2, 8}, {1, 9, 6, 3, 4}, {2, 150, 4, 2, 8}}
	for _, s := range shapes {
		for _, rc := range ropeConfigs {
			for _, dt := range floatDTypes {
				t.Run(fmt.Sprintf("B%d_T%d_NH%d_NKV%d_hs%d/%s/%v", s.B, s.T, s.NH, s.NKV, s.hs, rc.name, dt), func(t *testing.T) {
					testRoPE(t, s, rc.cfg, dt)
				})
			}
		}
	}
}

func testRoPE(t *testing.T, s ropeShape, cfg kernels.RoPEConfig, dt kernels.DType) {
	B, T, NH, NKV, hs := s.B, s.T, s.NH, s.NKV, s.hs
	W := kernels.GQAWidth(NH, NKV, hs)
	n := B * T * W
	be := openBE(t, 0)
	q := be.DefaultQueue()
	r := rand.New(rand.NewPCG(42, uint64(n)))
	x, dy, dx0 := randVals(r, n, 1), randVals(r, n, 1), randVals(r, n, 1)
	tab := cfg.Table(T, hs)
	ttab := upload(t, be, kernels.F32, tab)
	tx, tdy := upload(t, be, dt, x), upload(t, be, dt, dy)

	// Forward, out of place and in place.
	out := upload(t, be, dt, nans(n))
	be.RoPEForward(q, out, tx, ttab, B, T, NH, NKV, hs)
	got := download(t, be, out)
	fwd := func(in [][]float64) []float64 { return rope64(in[0], to64(tab), B, T, NH, NKV, hs) }
	ins := [][]float64{to64(x)}
	checkTol(t, "out", dt, got, fwd(ins))
	inPlace := upload(t, be, dt, x)
	be.RoPEForward(q, inPlace, inPlace, ttab, B, T, NH, NKV, hs)
	checkBitwise(t, "in-place out", download(t, be, inPlace), got)

	// Position 0 is the identity and value heads are copied: bit for bit.
	// Every rotated pair keeps its norm.
	xr := download(t, be, tx) // x as rounded to dt (exact: randVals)
	half := hs / 2
	for bt := 0; bt < B*T; bt++ {
		for j := 0; j < W; j++ {
			i := bt*W + j
			if (bt%T == 0 || j >= (NH+NKV)*hs) && math.Float32bits(got[i]) != math.Float32bits(xr[i]) {
				t.Fatalf("token %d (position %d) element %d: %v, want it unchanged (%v)", bt, bt%T, j, got[i], xr[i])
			}
		}
		for h := 0; h < NH+NKV; h++ {
			for k := 0; k < half; k++ {
				i0, i1 := bt*W+h*hs+k, bt*W+h*hs+k+half
				n0 := math.Hypot(float64(xr[i0]), float64(xr[i1]))
				n1 := math.Hypot(float64(got[i0]), float64(got[i1]))
				if math.Abs(n1-n0) > 1e-5*n0+4/256.0*n0*btoi(dt != kernels.F32) {
					t.Fatalf("token %d head %d pair %d: norm %v after rotation, %v before", bt, h, k, n1, n0)
				}
			}
		}
	}

	// Backward: accumulating, and overwriting (out of place and in place).
	// The gradient: finite differences where they are cheap; else, since
	// the op is linear, x ↦ Σ dy·R·x has gradient Rᵀ·dy, which is the
	// reference with the table's sines negated (checked against finite
	// differences on the small shapes).
	inv := to64(tab)
	for p := 0; p < T; p++ {
		for i := hs / 2; i < hs; i++ {
			inv[p*hs+i] = -inv[p*hs+i]
		}
	}
	grad := rope64(to64(dy), inv, B, T, NH, NKV, hs)
	if n < 2000 {
		checkTol(t, "Rᵀ·dy vs finite differences", kernels.F32, f32s64(grad), numGrad(fwd, ins, to64(dy), 0))
	}
	dx := upload(t, be, dt, dx0)
	be.RoPEBackward(q, dx, tdy, ttab, B, T, NH, NKV, hs)
	checkTol(t, "dinp", dt, download(t, be, dx), plus(dx0, grad))
	dset := upload(t, be, dt, nans(n))
	be.RoPEBackwardSet(q, dset, tdy, ttab, B, T, NH, NKV, hs)
	gotSet := download(t, be, dset)
	checkTol(t, "dinp (set)", dt, gotSet, grad)
	dIn := upload(t, be, dt, dy)
	be.RoPEBackwardSet(q, dIn, dIn, ttab, B, T, NH, NKV, hs)
	checkBitwise(t, "dinp (set, in place)", download(t, be, dIn), gotSet)
}

func btoi(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// TestRoPEConvention checks the rotate_half pairing with values worked
// out by hand: hs = 4, theta = 10000, so the pairs (0,2) and (1,3) turn
// by 1 and 0.01 radians per position.
func TestRoPEConvention(t *testing.T) {
	be := openBE(t, 0)
	q := be.DefaultQueue()
	// B=1, T=2, one query head, one key head, one value head; position 1
	// holds the unit vectors e0 (query) and e2 (key).
	x := []float32{
		5, 6, 7, 8, 1, 2, 3, 4, 9, 9, 9, 9, // position 0
		1, 0, 0, 0, 0, 0, 1, 0, 9, 9, 9, 9, // position 1
	}
	tab := upload(t, be, kernels.F32, kernels.RoPEConfig{Theta: 10000}.Table(2, 4))
	out := upload(t, be, kernels.F32, nans(len(x)))
	be.RoPEForward(q, out, upload(t, be, kernels.F32, x), tab, 1, 2, 1, 1, 4)
	c, s := math.Cos(1), math.Sin(1)
	want := []float64{
		5, 6, 7, 8, 1, 2, 3, 4, 9, 9, 9, 9,
		c, 0, s, 0, -s, 0, c, 0, 9, 9, 9, 9,
	}
	checkTol(t, "rotated", kernels.F32, download(t, be, out), want)
	// The second pair turns by 0.01 rad: e1 at position 1.
	x2 := []float32{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	be.RoPEForward(q, out, upload(t, be, kernels.F32, x2), tab, 1, 2, 1, 1, 4)
	want2 := make([]float64, 24)
	want2[13], want2[15] = math.Cos(0.01), math.Sin(0.01)
	checkTol(t, "rotated e1", kernels.F32, download(t, be, out), want2)
}

func TestRoPEMisuse(t *testing.T) {
	be := openBE(t, 0)
	q := be.DefaultQueue()
	const B, T, NH, NKV, hs = 1, 2, 2, 1, 4
	n := B * T * kernels.GQAWidth(NH, NKV, hs)
	buf := upload(t, be, kernels.F32, make([]float32, n+1))
	tab := upload(t, be, kernels.F32, kernels.RoPEConfig{Theta: 10000}.Table(T, hs))
	mustPanic(t, "partly overlapping forward", "overlaps", func() {
		be.RoPEForward(q, buf.Slice(1, n), buf.Slice(0, n), tab, B, T, NH, NKV, hs)
	})
	mustPanic(t, "accumulating backward in place", "overlaps", func() {
		be.RoPEBackward(q, buf.Slice(0, n), buf.Slice(0, n), tab, B, T, NH, NKV, hs)
	})
	mustPanic(t, "odd head size", "odd", func() {
		be.RoPEForward(q, buf.Slice(0, 18), buf.Slice(0, 18), tab, 1, 2, 2, 1, 3)
	})
	mustPanic(t, "short table", "table", func() {
		be.RoPEForward(q, buf.Slice(0, n), buf.Slice(0, n), tab.Slice(0, T*hs-1), B, T, NH, NKV, hs)
	})
	mustPanic(t, "NH not a multiple of NKV", "multiple", func() {
		be.GQAttentionForward(q, buf, buf, buf, 1, 1, 3, 2, 2)
	})
	syncQ(t, be)
}

// TestGQAttentionForwardLarge runs the forward in several parallel
// chunks of rows (the backward's tasks are (batch, key/value head) pairs,
// several in TestGQAttention already).
func TestGQAttentionForwardLarge(t *testing.T) {
	const B, T, NH, NKV, hs = 2, 40, 4, 2, 8
	W, C := kernels.GQAWidth(NH, NKV, hs), NH*hs
	for _, dt := range floatDTypes {
		be := openBE(t, 0)
		r := rand.New(rand.NewPCG(50, 51))
		x := randVals(r, B*T*W, 1)
		out, lse := upload(t, be, dt, nans(B*T*C)), upload(t, be, kernels.F32, nans(B*NH*T))
		be.GQAttentionForward(be.DefaultQueue(), out, lse, upload(t, be, dt, x), B, T, NH, NKV, hs)
		o64, l64 := gqa64(to64(x), B, T, NH, NKV, hs)
		checkTol(t, fmt.Sprint("out ", dt), dt, download(t, be, out), o64)
		checkTol(t, fmt.Sprint("lse ", dt), kernels.F32, download(t, be, lse), l64)
	}
}

func TestGQAttention(t *testing.T) {
	shapes := []ropeShape{{1, 5, 4, 2, 3}, {2, 7, 6, 3, 4}, {2, 6, 4, 1, 5}, {1, 1, 2, 1, 4}, {1, 17, 4, 2, 8}}
	for _, s := range shapes {
		for _, dt := range floatDTypes {
			t.Run(fmt.Sprintf("B%d_T%d_NH%d_NKV%d_hs%d/%v", s.B, s.T, s.NH, s.NKV, s.hs, dt), func(t *testing.T) {
				B, T, NH, NKV, hs := s.B, s.T, s.NH, s.NKV, s.hs
				W, C := kernels.GQAWidth(NH, NKV, hs), NH*hs
				be := openBE(t, 0)
				q := be.DefaultQueue()
				r := rand.New(rand.NewPCG(43, uint64(B*T*W)))
				x, dy, dx0 := randVals(r, B*T*W, 1), randVals(r, B*T*C, 1), randVals(r, B*T*W, 1)
				tx, tdy := upload(t, be, dt, x), upload(t, be, dt, dy)
				out, lse := upload(t, be, dt, nans(B*T*C)), upload(t, be, kernels.F32, nans(B*NH*T))
				be.GQAttentionForward(q, out, lse, tx, B, T, NH, NKV, hs)
				ins := [][]float64{to64(x)}
				o64, l64 := gqa64(ins[0], B, T, NH, NKV, hs)
				checkTol(t, "out", dt, download(t, be, out), o64)
				checkTol(t, "lse", kernels.F32, download(t, be, lse), l64)
				fwd := func(in [][]float64) []float64 { o, _ := gqa64(in[0], B, T, NH, NKV, hs); return o }
				dx := upload(t, be, dt, dx0)
				be.GQAttentionBackward(q, dx, tdy, tx, out, lse, B, T, NH, NKV, hs)
				checkTol(t, "dqkv", dt, download(t, be, dx), plus(dx0, numGrad(fwd, ins, to64(dy), 0)))
			})
		}
	}
}

// TestGQAttentionIsRepeatedKV checks the head grouping against the
// multi-head op run on the key and value heads repeated NH/NKV times
// (transformers' repeat_kv): the same outputs bit for bit, and key and
// value gradients that are the sums over each group.
func TestGQAttentionIsRepeatedKV(t *testing.T) {
	const B, T, NH, NKV, hs = 2, 5, 6, 2, 4
	const C, rep = NH * hs, NH / NKV
	W := kernels.GQAWidth(NH, NKV, hs)
	be := openBE(t, 0)
	q := be.DefaultQueue()
	r := rand.New(rand.NewPCG(46, 47))
	x, dy := randVals(r, B*T*W, 1), randVals(r, B*T*C, 1)
	wide := make([]float32, B*T*3*C) // (B,T,3C): q | k repeated | v repeated
	for bt := 0; bt < B*T; bt++ {
		copy(wide[bt*3*C:][:C], x[bt*W:][:C])
		for h := 0; h < NH; h++ {
			kv := h / rep
			copy(wide[bt*3*C+C+h*hs:][:hs], x[bt*W+C+kv*hs:][:hs])
			copy(wide[bt*3*C+2*C+h*hs:][:hs], x[bt*W+C+NKV*hs+kv*hs:][:hs])
		}
	}
	tdy := upload(t, be, kernels.F32, dy)
	tx, tw := upload(t, be, kernels.F32, x), upload(t, be, kernels.F32, wide)
	gout, glse := upload(t, be, kernels.F32, nans(B*T*C)), upload(t, be, kernels.F32, nans(B*NH*T))
	mout, mlse := upload(t, be, kernels.F32, nans(B*T*C)), upload(t, be, kernels.F32, nans(B*NH*T))
	be.GQAttentionForward(q, gout, glse, tx, B, T, NH, NKV, hs)
	be.AttentionForward(q, mout, mlse, tw, B, T, C, NH)
	checkBitwise(t, "out", download(t, be, gout), download(t, be, mout))
	checkBitwise(t, "lse", download(t, be, glse), download(t, be, mlse))

	gdx, mdx := upload(t, be, kernels.F32, make([]float32, B*T*W)), upload(t, be, kernels.F32, make([]float32, B*T*3*C))
	be.GQAttentionBackward(q, gdx, tdy, tx, gout, glse, B, T, NH, NKV, hs)
	be.AttentionBackward(q, mdx, tdy, tw, mout, mlse, B, T, C, NH)
	md := download(t, be, mdx)
	want := make([]float64, B*T*W)
	for bt := 0; bt < B*T; bt++ {
		for i := 0; i < C; i++ {
			want[bt*W+i] = float64(md[bt*3*C+i])
		}
		for h := 0; h < NH; h++ {
			kv := h / rep
			for i := 0; i < hs; i++ {
				want[bt*W+C+kv*hs+i] += float64(md[bt*3*C+C+h*hs+i])
				want[bt*W+C+NKV*hs+kv*hs+i] += float64(md[bt*3*C+2*C+h*hs+i])
			}
		}
	}
	checkTol(t, "dqkv", kernels.F32, download(t, be, gdx), want)
}

// llamaDTCases are the Llama ops in the form of dtCases: every output in
// bf16 or f16 must be the f32 path's result rounded once.
func llamaDTCases() []dtCase {
	r := rand.New(rand.NewPCG(48, 49))
	rv := func(n int) []float32 { return randVals(r, n, 1) }
	const N, C, E = 7, 9, 50
	const B, T, NH, NKV, hs = 2, 3, 4, 2, 6
	W := kernels.GQAWidth(NH, NKV, hs)
	tab := ropeConfigs[1].cfg.Table(T, hs)
	return []dtCase{
		{name: "RMSNorm", floats: [][]float32{rv(N * C), rv(N * C), rv(C), rv(N * C), rv(C), rv(N * C)}, outs: []int{0, 3, 4},
			f32s: [][]float32{make([]float32, N)}, f32outs: []int{0},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.RMSNormForward(q, f[0], g[0], f[1], f[2], N, C, 1e-6)
				be.RMSNormBackward(q, f[3], f[4], f[5], f[1], f[2], g[0], N, C)
			}},
		{name: "SwiGLU", floats: [][]float32{rv(E), rv(E), rv(E), rv(E), rv(E), rv(E)}, outs: []int{0, 3, 4},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.SwiGLUForward(q, f[0], f[1], f[2], E)
				be.SwiGLUBackward(q, f[3], f[4], f[5], f[1], f[2], E)
			}},
		{name: "RoPE", floats: [][]float32{rv(B * T * W), rv(B * T * W), rv(B * T * W), rv(B * T * W), rv(B * T * W), rv(B * T * W)}, outs: []int{0, 2, 3, 4},
			f32s: [][]float32{tab},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.RoPEForward(q, f[0], f[1], g[0], B, T, NH, NKV, hs)
				be.RoPEForward(q, f[2], f[2], g[0], B, T, NH, NKV, hs)
				be.RoPEBackward(q, f[3], f[5], g[0], B, T, NH, NKV, hs)
				be.RoPEBackwardSet(q, f[4], f[4], g[0], B, T, NH, NKV, hs)
			}},
		{name: "GQAttention", floats: [][]float32{rv(B * T * NH * hs), rv(B * T * W), rv(B * T * W), rv(B * T * NH * hs)}, outs: []int{0, 2},
			f32s: [][]float32{make([]float32, B*NH*T)}, f32outs: []int{0},
			run: func(be *Backend, q kernels.Queue, f, g, ii []kernels.Tensor) {
				be.GQAttentionForward(q, f[0], g[0], f[1], B, T, NH, NKV, hs)
				be.GQAttentionBackward(q, f[2], f[3], f[1], f[0], g[0], B, T, NH, NKV, hs)
			}},
	}
}

func TestLlamaDTypePathsRoundOnce(t *testing.T) { checkRoundOnce(t, llamaDTCases()) }
