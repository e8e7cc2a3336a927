//go:build cuda

package cuda

import (
	"fmt"
	"math"

	"github.com/spill-ml/spill/kernels"
	"gorgonia.org/cu"
)

// Argument checks (programming errors panic at enqueue time).

func needFloat(op, name string, t kernels.Tensor) {
	if !t.DType.IsFloat() {
		panic(fmt.Sprintf("kernels/cuda: %s: %s has dtype %v, want f32, bf16 or f16", op, name, t.DType))
	}
}

func needDType(op, name string, t kernels.Tensor, d kernels.DType) {
	if t.DType != d {
		panic(fmt.Sprintf("kernels/cuda: %s: %s has dtype %v, want %v", op, name, t.DType, d))
	}
}

func needN(op, name string, t kernels.Tensor, n int) {
	if t.N < n {
		panic(fmt.Sprintf("kernels/cuda: %s: %s has %d elements, needs %d", op, name, t.N, n))
	}
}

func needDims(op string, dims ...int) {
	for _, d := range dims {
		if d < 0 {
			// A copy goes to Sprintf, so that dims does not escape: the
			// callers' argument slices stay on their stacks.
			panic(fmt.Sprintf("kernels/cuda: %s: negative dimension in %v", op, append([]int(nil), dims...)))
		}
	}
}

// operand is a checked float tensor: device address and dtype (0 and 0 for
// an absent optional operand).
type operand struct {
	p  cu.DevicePtr
	dt kernels.DType
}

func (o operand) args() (uint64, uint64) { return aPtr(o.p), aDT(o.dt) }

// float checks a required float tensor of at least n elements.
func (b *Backend) float(op, name string, t kernels.Tensor, n int) operand {
	if t.IsZero() {
		panic(fmt.Sprintf("kernels/cuda: %s: %s is required", op, name))
	}
	needFloat(op, name, t)
	needN(op, name, t, n)
	return operand{b.devPtr(t, op, name), t.DType}
}

// optFloat is float for an optional operand.
func (b *Backend) optFloat(op, name string, t kernels.Tensor, n int) operand {
	if t.IsZero() {
		return operand{}
	}
	return b.float(op, name, t, n)
}

func (b *Backend) typed(op, name string, t kernels.Tensor, d kernels.DType, n int) cu.DevicePtr {
	if t.IsZero() {
		panic(fmt.Sprintf("kernels/cuda: %s: %s is required", op, name))
	}
	needDType(op, name, t, d)
	needN(op, name, t, n)
	return b.devPtr(t, op, name)
}

const threads = 256

// elems is the grid of a grid-stride elementwise kernel over n elements.
func elems(n int) dim3 { return dim3{x: int(min((int64(n)+threads-1)/threads, 1<<16))} }

var block = dim3{x: threads}

// rows is the grid for one warp per row, 8 rows per block.
func rows(n int) dim3 { return dim3{x: (n + 7) / 8} }

// Typed kernels (NAME_f32, NAME_bf16, NAME_f16) take every float operand in
// one dtype and access memory in 16-byte vectors of vecN(dt) elements.

// typedFn returns kernel name specialised for dt, if the PTX has it (PTX
// older than the kernel falls back to the generic one).
func (b *Backend) typedFn(name string, dt kernels.DType) (kfunc, bool) {
	var sfx string
	switch dt {
	case kernels.F32:
		sfx = "_f32"
	case kernels.BF16:
		sfx = "_bf16"
	case kernels.F16:
		sfx = "_f16"
	default:
		return 0, false
	}
	f, ok := b.fns[name+sfx]
	return f, ok
}

// hasFns reports whether the PTX has all the kernels named.
func (b *Backend) hasFns(names ...string) bool {
	for _, n := range names {
		if _, ok := b.fns[n]; !ok {
			return false
		}
	}
	return true
}

// vecN is the number of elements of dtype dt in 16 bytes.
func vecN(dt kernels.DType) int { return 16 / dt.Size() }

// sameDT reports whether every operand present (p != 0) has dtype dt.
func sameDT(dt kernels.DType, ops ...operand) bool {
	for _, o := range ops {
		if o.p != 0 && o.dt != dt {
			return false
		}
	}
	return true
}

// aligned16 reports whether every pointer is 16-byte aligned.
func aligned16(ps ...cu.DevicePtr) bool {
	for _, p := range ps {
		if p%16 != 0 {
			return false
		}
	}
	return true
}

// alignedLike reports whether every pointer is aligned to es bytes and all
// are congruent modulo 16 (what the typed elementwise kernels need).
func alignedLike(es int, ps ...cu.DevicePtr) bool {
	for _, p := range ps {
		if p%cu.DevicePtr(es) != 0 || p%16 != ps[0]%16 {
			return false
		}
	}
	return true
}

// vecGrid is the grid of a typed grid-stride kernel over n elements of dt,
// one 16-byte vector per thread and step.
func vecGrid(n int, dt kernels.DType) dim3 {
	per := int64(threads * vecN(dt))
	return dim3{x: int(min((int64(n)+per-1)/per, 4096))}
}

// Zero sets t to 0.
func (b *Backend) Zero(kq kernels.Queue, t kernels.Tensor) {
	q := b.queue(kq)
	p := b.devPtr(t, "Zero", "t")
	if n := t.Bytes(); n > 0 {
		q.memset(p, 1, 0, n)
	}
}

// Fill sets every element of t to v, rounded to t's dtype.
func (b *Backend) Fill(kq kernels.Queue, t kernels.Tensor, v float32) {
	q := b.queue(kq)
	p := b.devPtr(t, "Fill", "t")
	n := int64(t.N)
	if n == 0 {
		return
	}
	var bits uint32
	switch t.DType {
	case kernels.F32:
		bits = math.Float32bits(v)
	case kernels.BF16:
		bits = uint32(kernels.BF16FromF32(v))
	case kernels.F16:
		bits = uint32(kernels.F16FromF32(v))
	case kernels.I32:
		bits = uint32(int32(v))
	case kernels.U32:
		bits = uint32(v)
	case kernels.U16:
		bits = uint32(uint16(v))
	case kernels.U8:
		bits = uint32(byte(v))
	default:
		panic(fmt.Sprintf("kernels/cuda: Fill: dtype %v", t.DType))
	}
	q.memset(p, t.DType.Size(), bits, n)
}

// Cast converts src into dst.
func (b *Backend) Cast(kq kernels.Queue, dst, src kernels.Tensor) {
	q := b.queue(kq)
	if dst.N != src.N {
		panic(fmt.Sprintf("kernels/cuda: Cast: %d elements into %d", src.N, dst.N))
	}
	d, s := b.float("Cast", "dst", dst, dst.N), b.float("Cast", "src", src, src.N)
	n := dst.N
	if n == 0 {
		return
	}
	if d.dt == s.dt {
		q.copyDevice(d.p, s.p, dst.Bytes())
		return
	}
	j := castJob(b, d, s, n)
	q.put(&j)
}

// castJob launches cast_forward: d = s over n elements.
func castJob(b *Backend, d, s operand, n int) job {
	return launchJob(b.fn("cast_forward"), elems(n), block, aPtr(d.p), aDT(d.dt), aPtr(s.p), aDT(s.dt), aI64(int64(n)))
}

// cast launches cast_forward on the queue's goroutine.
func (q *queue) cast(d, s operand, n int) error {
	j := castJob(q.b, d, s, n)
	hostStats.launches.Add(1)
	return j.launchOn(q.stream)
}

// Add computes dst += src.
func (b *Backend) Add(kq kernels.Queue, dst, src kernels.Tensor) {
	q := b.queue(kq)
	if dst.N != src.N {
		panic(fmt.Sprintf("kernels/cuda: Add: %d elements into %d", src.N, dst.N))
	}
	d, s := b.float("Add", "dst", dst, dst.N), b.float("Add", "src", src, src.N)
	n := dst.N
	if f, ok := b.typedFn("add_forward", d.dt); ok && s.dt == d.dt && alignedLike(d.dt.Size(), d.p, s.p) {
		q.launch(f, vecGrid(n, d.dt), block, aPtr(d.p), aPtr(s.p), aI64(int64(n)))
		return
	}
	q.launch(b.fn("add_forward"), elems(n), block, aPtr(d.p), aDT(d.dt), aPtr(s.p), aDT(s.dt), aI64(int64(n)))
}

// Scale computes t *= s.
func (b *Backend) Scale(kq kernels.Queue, t kernels.Tensor, s float32) {
	q := b.queue(kq)
	o := b.float("Scale", "t", t, t.N)
	n := t.N
	q.launch(b.fn("scale_forward"), elems(n), block, aPtr(o.p), aDT(o.dt), aF32(s), aI64(int64(n)))
}

// GeluForward computes out = gelu(inp).
func (b *Backend) GeluForward(kq kernels.Queue, out, inp kernels.Tensor, N int) {
	q := b.queue(kq)
	needDims("GeluForward", N)
	o, i := b.float("GeluForward", "out", out, N), b.float("GeluForward", "inp", inp, N)
	if f, ok := b.typedFn("gelu_forward", o.dt); ok && i.dt == o.dt && alignedLike(o.dt.Size(), o.p, i.p) {
		q.launch(f, vecGrid(N, o.dt), block, aPtr(o.p), aPtr(i.p), aI64(int64(N)))
		return
	}
	q.launch(b.fn("gelu_forward"), elems(N), block, aPtr(o.p), aDT(o.dt), aPtr(i.p), aDT(i.dt), aI64(int64(N)))
}

// GeluBackward accumulates dinp += gelu'(inp)·dout.
func (b *Backend) GeluBackward(kq kernels.Queue, dinp, inp, dout kernels.Tensor, N int) {
	b.geluBackward(kq, false, dinp, inp, dout, N)
}

// GeluBackwardSet computes dinp = gelu'(inp)·dout without reading dinp
// (gelu_backward_set_*) where the fast path applies, else as Zero and
// GeluBackward: kernels.Overwriter.
func (b *Backend) GeluBackwardSet(kq kernels.Queue, dinp, inp, dout kernels.Tensor, N int) {
	b.geluBackward(kq, true, dinp, inp, dout, N)
}

func (b *Backend) geluBackward(kq kernels.Queue, set bool, dinp, inp, dout kernels.Tensor, N int) {
	q := b.queue(kq)
	needDims("GeluBackward", N)
	d := b.float("GeluBackward", "dinp", dinp, N)
	i := b.float("GeluBackward", "inp", inp, N)
	g := b.float("GeluBackward", "dout", dout, N)
	name := "gelu_backward"
	if set {
		name = "gelu_backward_set"
	}
	if f, ok := b.typedFn(name, d.dt); ok && sameDT(d.dt, i, g) && alignedLike(d.dt.Size(), d.p, i.p, g.p) {
		q.launch(f, vecGrid(N, d.dt), block, aPtr(d.p), aPtr(i.p), aPtr(g.p), aI64(int64(N)))
		return
	}
	if set {
		b.Zero(kq, dinp)
	}
	q.launch(b.fn("gelu_backward"), elems(N), block, aPtr(d.p), aDT(d.dt), aPtr(i.p), aDT(i.dt),
		aPtr(g.p), aDT(g.dt), aI64(int64(N)))
}

// MSEForward computes losses = (pred-target)²/2.
func (b *Backend) MSEForward(kq kernels.Queue, losses, pred, target kernels.Tensor, N int) {
	q := b.queue(kq)
	needDims("MSEForward", N)
	l := b.typed("MSEForward", "losses", losses, kernels.F32, N)
	p := b.float("MSEForward", "pred", pred, N)
	t := b.typed("MSEForward", "target", target, kernels.F32, N)
	q.launch(b.fn("mse_forward"), elems(N), block, aPtr(l), aPtr(p.p), aDT(p.dt), aPtr(t), aI64(int64(N)))
}

// MSEBackward accumulates dpred += scale·(pred-target).
func (b *Backend) MSEBackward(kq kernels.Queue, dpred, pred, target kernels.Tensor, N int, scale float32) {
	q := b.queue(kq)
	needDims("MSEBackward", N)
	d := b.float("MSEBackward", "dpred", dpred, N)
	p := b.float("MSEBackward", "pred", pred, N)
	t := b.typed("MSEBackward", "target", target, kernels.F32, N)
	q.launch(b.fn("mse_backward"), elems(N), block, aPtr(d.p), aDT(d.dt), aPtr(p.p), aDT(p.dt), aPtr(t),
		aI64(int64(N)), aF32(scale))
}

// AdamW runs one fused AdamW step.
func (b *Backend) AdamW(kq kernels.Queue, param, grad, m, v, out kernels.Tensor, p kernels.AdamWParams) {
	q := b.queue(kq)
	N := param.N
	pp := b.typed("AdamW", "param", param, kernels.F32, N)
	g := b.float("AdamW", "grad", grad, N)
	mp := b.typed("AdamW", "m", m, kernels.F32, N)
	vp := b.typed("AdamW", "v", v, kernels.F32, N)
	o := b.optFloat("AdamW", "out", out, N)
	if p.Step < 1 {
		panic(fmt.Sprintf("kernels/cuda: AdamW: step %d, want >= 1", p.Step))
	}
	bc1 := float32(1 - math.Pow(float64(p.Beta1), float64(p.Step)))
	bc2 := float32(1 - math.Pow(float64(p.Beta2), float64(p.Step)))
	gs := p.GradScale
	if gs == 0 {
		gs = 1
	}
	if fn, ok := b.fns[adamw4Name(g.dt, o.dt)]; ok && aligned16(pp, mp, vp) && g.p%cu.DevicePtr(4*g.dt.Size()) == 0 &&
		(o.p == 0 || o.p%cu.DevicePtr(4*o.dt.Size()) == 0) {
		q.launch(fn, dim3{x: max(int(min((int64(N)/4+threads-1)/threads, 8192)), 1)}, block, aPtr(pp), aPtr(g.p), aPtr(mp), aPtr(vp),
			aPtr(o.p), aI64(int64(N)), aF32(p.LR), aF32(p.Beta1), aF32(p.Beta2), aF32(p.Eps),
			aF32(p.WeightDecay), aF32(bc1), aF32(bc2), aF32(gs))
		return
	}
	q.launch(b.fn("adamw_update"), elems(N), block, aPtr(pp), aPtr(g.p), aDT(g.dt), aPtr(mp), aPtr(vp),
		aPtr(o.p), aDT(o.dt), aI64(int64(N)), aF32(p.LR), aF32(p.Beta1), aF32(p.Beta2), aF32(p.Eps),
		aF32(p.WeightDecay), aF32(bc1), aF32(bc2), aF32(gs))
}

// adamw4Name is the AdamW kernel with four elements per thread for
// gradient dtype g and copy dtype o (0: no copy), "" where there is none
// (the generic adamw_update serves). Constant names: a launch formats
// nothing.
func adamw4Name(g, o kernels.DType) string {
	switch {
	case g == kernels.BF16 && o == kernels.BF16:
		return "adamw_update4_bf16_bf16"
	case g == kernels.BF16 && o == 0:
		return "adamw_update4_bf16_none"
	case g == kernels.F32 && o == 0:
		return "adamw_update4_f32_none"
	case g == kernels.F32 && o == kernels.BF16:
		return "adamw_update4_f32_bf16"
	case g == kernels.F32 && o == kernels.F32:
		return "adamw_update4_f32_f32"
	case g == kernels.F16 && o == kernels.F16:
		return "adamw_update4_f16_f16"
	}
	return ""
}

// SumSquaresFinite accumulates out[0] += Σ x² and sets out[1] = 1 if x
// holds a NaN or Inf, in one pass over x: one partial sum per block into
// the scratch area (a fixed grid, so the sum does not depend on
// scheduling), then their fixed-order sum.
func (b *Backend) SumSquaresFinite(kq kernels.Queue, out, x kernels.Tensor) {
	q := b.queue(kq)
	o := b.typed("SumSquaresFinite", "out", out, kernels.F32, 2)
	xs := b.float("SumSquaresFinite", "x", x, x.N)
	n := x.N
	if n == 0 {
		return
	}
	fn, ok := b.typedFn("sum_squares_finite_partial", xs.dt)
	if !ok {
		panic(fmt.Sprintf("kernels/cuda: SumSquaresFinite: no kernel for %v", xs.dt))
	}
	per := int64(threads * vecN(xs.dt))
	g := int(min((int64(n)+per-1)/per, 1024))
	part := int64(g) * 4
	js := [...]job{
		launchJob(fn, dim3{x: g}, block, 0, aPtr(o+4), aPtr(xs.p), aI64(int64(n))).withScratch(part, 0),
		launchJob(b.fn("sum_squares_final"), dim3{x: 1}, dim3{x: 1024}, aPtr(o), 0, aI32(g)).withScratch(part, 1),
	}
	q.putGroup(js[:])
}

// EncoderForward computes out = wte[tokens] + wpe[t].
func (b *Backend) EncoderForward(kq kernels.Queue, out, tokens, wte, wpe kernels.Tensor, B, T, C int) {
	q := b.queue(kq)
	const op = "EncoderForward"
	needDims(op, B, T, C)
	if C == 0 || B*T == 0 {
		return
	}
	o := b.float(op, "out", out, B*T*C)
	tk := b.typed(op, "tokens", tokens, kernels.I32, B*T)
	w := b.float(op, "wte", wte, C)
	p := b.float(op, "wpe", wpe, T*C)
	V := wte.N / C
	if f, ok := b.typedFn("encoder_forward", o.dt); ok && sameDT(o.dt, w, p) && C%vecN(o.dt) == 0 && aligned16(o.p, w.p, p.p) {
		q.launch(f, vecGrid(B*T*C, o.dt), block, aPtr(o.p), aPtr(tk), aPtr(w.p), aPtr(p.p),
			aI32(B), aI32(T), aI32(C), aI32(V))
		return
	}
	q.launch(b.fn("encoder_forward"), elems(B*T*C), block, aPtr(o.p), aDT(o.dt), aPtr(tk), aPtr(w.p), aDT(w.dt),
		aPtr(p.p), aDT(p.dt), aI32(B), aI32(T), aI32(C), aI32(V))
}

// EncoderBackward accumulates into dwte and dwpe.
func (b *Backend) EncoderBackward(kq kernels.Queue, dwte, dwpe, dout, tokens kernels.Tensor, B, T, C int) {
	q := b.queue(kq)
	const op = "EncoderBackward"
	needDims(op, B, T, C)
	if C == 0 || B*T == 0 {
		return
	}
	g := b.float(op, "dout", dout, B*T*C)
	tk := b.typed(op, "tokens", tokens, kernels.I32, B*T)
	dw := b.optFloat(op, "dwte", dwte, C)
	dp := b.optFloat(op, "dwpe", dwpe, T*C)
	V := dwte.N / C
	BT := B * T
	nt := min(1024, (C+31)/32*32)
	// dwte by buckets of positions per token (encoder.cu), typed when dwte
	// and dout share a dtype and C fills whole 16-byte vectors.
	buckets := b.hasFns("encoder_bwd_count", "encoder_bwd_scan", "encoder_bwd_place", "encoder_bwd_sum")
	sumFn, typedSum := b.typedFn("encoder_bwd_sum", dw.dt)
	typedSum = typedSum && g.dt == dw.dt && C%vecN(dw.dt) == 0 && aligned16(dw.p, g.p)
	wpeFn, typedWpe := b.typedFn("encoder_backward_wpe", dp.dt)
	typedWpe = typedWpe && g.dt == dp.dt && (T*C)%vecN(dp.dt) == 0 && aligned16(dp.p, g.p)
	if dw.p != 0 && buckets {
		// int scratch: cnt(V), off(V), fill(V), pos(BT) (offsets into the
		// scratch area).
		need := 4 * (3*int64(V) + int64(BT))
		cnt, off := uint64(0), uint64(4*V)
		fill, pos := off+uint64(4*V), off+uint64(8*V)
		sum := launchJob(b.fn("encoder_bwd_sum"), dim3{x: BT}, dim3{x: 128}, aPtr(dw.p), aDT(dw.dt), aPtr(g.p), aDT(g.dt),
			aPtr(tk), pos, off, cnt, aI32(BT), aI32(C)).withScratch(need, 5, 6, 7)
		if typedSum {
			sum = launchJob(sumFn, dim3{x: BT}, dim3{x: 128}, aPtr(dw.p), aPtr(g.p), aPtr(tk), pos, off, cnt,
				aI32(BT), aI32(C)).withScratch(need, 3, 4, 5)
		}
		js := [...]job{
			memsetJob(cnt, 4, 0, int64(V)).withScratch(need, 0),
			memsetJob(pos, 4, 0xffffffff, int64(BT)).withScratch(need, 0),
			launchJob(b.fn("encoder_bwd_count"), elems(BT), block, cnt, aPtr(tk), aI32(BT), aI32(V)).withScratch(need, 0),
			launchJob(b.fn("encoder_bwd_scan"), dim3{x: 1}, dim3{x: 1024}, off, fill, cnt, aI32(V)).withScratch(need, 0, 1, 2),
			launchJob(b.fn("encoder_bwd_place"), elems(BT), block, pos, fill, aPtr(tk), aI32(BT), aI32(V)).withScratch(need, 0, 1),
			sum,
		}
		q.putGroup(js[:])
	} else if dw.p != 0 {
		q.launch(b.fn("encoder_backward"), dim3{x: BT}, dim3{x: nt}, aPtr(dw.p), aDT(dw.dt), aPtr(g.p), aDT(g.dt),
			aPtr(tk), aI32(BT), aI32(C), aI32(V))
	}
	if dp.p != 0 && typedWpe {
		q.launch(wpeFn, vecGrid(T*C, dp.dt), block, aPtr(dp.p), aPtr(g.p), aI32(B), aI32(T), aI32(C))
	} else if dp.p != 0 {
		q.launch(b.fn("encoder_backward_wpe"), elems(T*C), block, aPtr(dp.p), aDT(dp.dt), aPtr(g.p), aDT(g.dt),
			aI32(B), aI32(T), aI32(C))
	}
}

// LayerNormForward normalises the rows of inp(N,C).
func (b *Backend) LayerNormForward(kq kernels.Queue, out, mean, rstd, inp, weight, bias kernels.Tensor, N, C int) {
	q := b.queue(kq)
	const op = "LayerNormForward"
	needDims(op, N, C)
	if N == 0 || C == 0 {
		return
	}
	o := b.float(op, "out", out, N*C)
	var mp, rp cu.DevicePtr
	if !mean.IsZero() {
		mp = b.typed(op, "mean", mean, kernels.F32, N)
	}
	if !rstd.IsZero() {
		rp = b.typed(op, "rstd", rstd, kernels.F32, N)
	}
	i := b.float(op, "inp", inp, N*C)
	w := b.float(op, "weight", weight, C)
	bs := b.optFloat(op, "bias", bias, C)
	if f, ok := b.typedFn("layernorm_forward", o.dt); ok && sameDT(o.dt, i, w, bs) && C%vecN(o.dt) == 0 &&
		aligned16(o.p, i.p, w.p, bs.p) {
		q.launch(f, rows(N), block, aPtr(o.p), aPtr(mp), aPtr(rp), aPtr(i.p), aPtr(w.p), aPtr(bs.p), aI32(N), aI32(C))
		return
	}
	q.launch(b.fn("layernorm_forward"), rows(N), block, aPtr(o.p), aDT(o.dt), aPtr(mp), aPtr(rp),
		aPtr(i.p), aDT(i.dt), aPtr(w.p), aDT(w.dt), aPtr(bs.p), aDT(bs.dt), aI32(N), aI32(C))
}

// LayerNormBackward accumulates dinp, dweight and dbias.
func (b *Backend) LayerNormBackward(kq kernels.Queue, dinp, dweight, dbias, dout, inp, weight, mean, rstd kernels.Tensor, N, C int) {
	q := b.queue(kq)
	const op = "LayerNormBackward"
	needDims(op, N, C)
	if N == 0 || C == 0 {
		return
	}
	di := b.optFloat(op, "dinp", dinp, N*C)
	dw := b.optFloat(op, "dweight", dweight, C)
	db := b.optFloat(op, "dbias", dbias, C)
	g := b.float(op, "dout", dout, N*C)
	i := b.float(op, "inp", inp, N*C)
	w := b.float(op, "weight", weight, C)
	mp := b.typed(op, "mean", mean, kernels.F32, N)
	rp := b.typed(op, "rstd", rstd, kernels.F32, N)
	dinpFn, typedDinp := b.typedFn("layernorm_backward", di.dt)
	typedDinp = typedDinp && sameDT(di.dt, g, i, w) && C%vecN(di.dt) == 0 && aligned16(di.p, g.p, i.p, w.p)
	// Parameter gradients: per-chunk partial sums in scratch, then a fixed-order sum.
	partFn, typedPart := b.typedFn("layernorm_params_partial", g.dt)
	typedPart = typedPart && b.hasFns("layernorm_params_final") && i.dt == g.dt && C%vecN(g.dt) == 0 && aligned16(g.p, i.p)
	var pgrid dim3
	rpc := 0
	if typedPart {
		pgrid.x = (C/vecN(g.dt) + 31) / 32
		rpc = max(8, (N*pgrid.x+511)/512) // about 512 blocks
		pgrid.y = (N + rpc - 1) / rpc
	}
	if di.p != 0 && typedDinp {
		q.launch(dinpFn, rows(N), block, aPtr(di.p), aPtr(g.p), aPtr(i.p), aPtr(w.p), aPtr(mp), aPtr(rp), aI32(N), aI32(C))
	} else if di.p != 0 {
		q.launch(b.fn("layernorm_backward"), rows(N), block, aPtr(di.p), aDT(di.dt), aPtr(g.p), aDT(g.dt),
			aPtr(i.p), aDT(i.dt), aPtr(w.p), aDT(w.dt), aPtr(mp), aPtr(rp), aI32(N), aI32(C))
	}
	switch {
	case (dw.p != 0 || db.p != 0) && typedPart:
		// The partial sums at offset 0 of the scratch area.
		need := int64(pgrid.y) * int64(2*C) * 4
		js := [...]job{
			launchJob(partFn, pgrid, dim3{x: 32, y: 8}, 0, aPtr(g.p), aPtr(i.p), aPtr(mp), aPtr(rp),
				aI32(N), aI32(C), aI32(rpc)).withScratch(need, 0),
			launchJob(b.fn("layernorm_params_final"), dim3{x: (C + 31) / 32}, dim3{x: 32, y: 32},
				aPtr(dw.p), aDT(dw.dt), aPtr(db.p), aDT(db.dt), 0, aI32(pgrid.y), aI32(C)).withScratch(need, 4),
		}
		q.putGroup(js[:])
	case dw.p != 0 || db.p != 0:
		q.launch(b.fn("layernorm_backward_params"), dim3{x: (C + 31) / 32}, dim3{x: 32, y: 32},
			aPtr(dw.p), aDT(dw.dt), aPtr(db.p), aDT(db.dt), aPtr(g.p), aDT(g.dt), aPtr(i.p), aDT(i.dt),
			aPtr(mp), aPtr(rp), aI32(N), aI32(C))
	}
}

// CrossEntropyForward computes per-row softmax cross-entropy losses.
func (b *Backend) CrossEntropyForward(kq kernels.Queue, losses, logits, targets kernels.Tensor, BT, V int) {
	q := b.queue(kq)
	const op = "CrossEntropyForward"
	needDims(op, BT, V)
	if BT == 0 {
		return
	}
	l := b.typed(op, "losses", losses, kernels.F32, BT)
	z := b.float(op, "logits", logits, BT*V)
	t := b.typed(op, "targets", targets, kernels.I32, BT)
	if f, ok := b.typedFn("crossentropy_forward", z.dt); ok && alignedLike(z.dt.Size(), z.p) {
		q.launch(f, dim3{x: BT}, dim3{x: 1024}, aPtr(l), aPtr(z.p), aPtr(t), aI32(BT), aI32(V))
		return
	}
	q.launch(b.fn("crossentropy_forward"), dim3{x: BT}, dim3{x: 512}, aPtr(l), aPtr(z.p), aDT(z.dt), aPtr(t),
		aI32(BT), aI32(V))
}

// CrossEntropyBackward accumulates dlogits += scale·(softmax - onehot).
func (b *Backend) CrossEntropyBackward(kq kernels.Queue, dlogits, logits, targets kernels.Tensor, BT, V int, scale float32) {
	b.crossEntropyBackward(kq, false, dlogits, logits, targets, BT, V, scale)
}

// CrossEntropyBackwardSet overwrites dlogits (crossentropy_backward_set_*
// where the fast path applies, else Zero and CrossEntropyBackward):
// kernels.Overwriter.
func (b *Backend) CrossEntropyBackwardSet(kq kernels.Queue, dlogits, logits, targets kernels.Tensor, BT, V int, scale float32) {
	b.crossEntropyBackward(kq, true, dlogits, logits, targets, BT, V, scale)
}

func (b *Backend) crossEntropyBackward(kq kernels.Queue, set bool, dlogits, logits, targets kernels.Tensor, BT, V int, scale float32) {
	q := b.queue(kq)
	const op = "CrossEntropyBackward"
	needDims(op, BT, V)
	if BT == 0 {
		return
	}
	d := b.float(op, "dlogits", dlogits, BT*V)
	z := b.float(op, "logits", logits, BT*V)
	t := b.typed(op, "targets", targets, kernels.I32, BT)
	name := "crossentropy_backward"
	if set {
		name = "crossentropy_backward_set"
	}
	if f, ok := b.typedFn(name, z.dt); ok && d.dt == z.dt && alignedLike(z.dt.Size(), z.p, d.p) {
		q.launch(f, dim3{x: BT}, dim3{x: 1024}, aPtr(d.p), aPtr(z.p), aPtr(t), aI32(BT), aI32(V), aF32(scale))
		return
	}
	if set {
		b.Zero(kq, dlogits)
	}
	q.launch(b.fn("crossentropy_backward"), dim3{x: BT}, dim3{x: 512}, aPtr(d.p), aDT(d.dt), aPtr(z.p), aDT(z.dt),
		aPtr(t), aI32(BT), aI32(V), aF32(scale))
}
