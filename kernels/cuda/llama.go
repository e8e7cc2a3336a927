//go:build cuda

package cuda

import (
	"fmt"

	"github.com/spill-ml/spill/kernels"
)

// The Llama kernels (kernels.LlamaOps): RMSNorm, RoPE and SwiGLU in
// kernels/llama.cu; grouped-query attention by the flash kernels
// (flashattn.cu: bf16, head size 64, 80, 96 or 128, where AttentionForward would
// take them) or else the row-wise CUDA-core kernels (attention.cu: any
// float dtype, head size up to maxHeadSize). With as many key/value heads
// as query heads the layout is AttentionForward's, and the attention ops
// are AttentionForward and AttentionBackward with their choice of
// implementation.

var _ kernels.LlamaOps = (*Backend)(nil)

// llamaDims panics unless every dimension is positive, as the CPU
// reference does.
func llamaDims(op string, dims ...int) {
	for _, d := range dims {
		if d <= 0 {
			panic(fmt.Sprintf("kernels/cuda: %s: dimensions %v must be positive", op, append([]int(nil), dims...)))
		}
	}
}

// gqaDims checks the RoPE and attention dimensions and returns the packed
// row width (NH+2·NKV)·hs.
func gqaDims(op string, B, T, NH, NKV, hs int) int {
	llamaDims(op, B, T, NH, NKV, hs)
	if NH%NKV != 0 {
		panic(fmt.Sprintf("kernels/cuda: %s: NH=%d query heads is not a multiple of NKV=%d key/value heads", op, NH, NKV))
	}
	return kernels.GQAWidth(NH, NKV, hs)
}

// overlap reports whether a and b share memory.
func overlap(a, b kernels.Tensor) bool {
	return a.Buf == b.Buf && a.Off < b.Off+b.Bytes() && b.Off < a.Off+a.Bytes()
}

// RMSNormForward implements kernels.LlamaOps: one warp per row, typed
// (rmsnorm_forward_*) when out, inp and weight share a dtype, C fills whole
// 16-byte vectors and the pointers are 16-byte aligned.
func (b *Backend) RMSNormForward(kq kernels.Queue, out, rstd, inp, weight kernels.Tensor, N, C int, eps float32) {
	q := b.queue(kq)
	const op = "RMSNormForward"
	llamaDims(op, N, C)
	if !(eps >= 0) {
		panic(fmt.Sprintf("kernels/cuda: %s: eps %v must be non-negative", op, eps))
	}
	o := b.float(op, "out", out, N*C)
	r := b.typed(op, "rstd", rstd, kernels.F32, N)
	i := b.float(op, "inp", inp, N*C)
	w := b.float(op, "weight", weight, C)
	if f, ok := b.typedFn("rmsnorm_forward", o.dt); ok && sameDT(o.dt, i, w) && C%vecN(o.dt) == 0 && aligned16(o.p, i.p, w.p) {
		q.launch(f, rows(N), block, aPtr(o.p), aPtr(r), aPtr(i.p), aPtr(w.p), aI32(N), aI32(C), aF32(eps))
		return
	}
	q.launch(b.fn("rmsnorm_forward"), rows(N), block, aPtr(o.p), aDT(o.dt), aPtr(r), aPtr(i.p), aDT(i.dt),
		aPtr(w.p), aDT(w.dt), aI32(N), aI32(C), aF32(eps))
}

// RMSNormBackward implements kernels.LlamaOps. dinp takes one warp per
// row; dweight is summed per chunk of rows into the scratch area
// (rmsnorm_dw_partial), then over the chunks in a fixed order
// (rmsnorm_dw_final), so that it does not depend on scheduling.
func (b *Backend) RMSNormBackward(kq kernels.Queue, dinp, dweight, dout, inp, weight, rstd kernels.Tensor, N, C int) {
	q := b.queue(kq)
	const op = "RMSNormBackward"
	llamaDims(op, N, C)
	di := b.optFloat(op, "dinp", dinp, N*C)
	dw := b.float(op, "dweight", dweight, C)
	g := b.float(op, "dout", dout, N*C)
	i := b.float(op, "inp", inp, N*C)
	w := b.float(op, "weight", weight, C)
	rp := b.typed(op, "rstd", rstd, kernels.F32, N)
	if di.p != 0 {
		if f, ok := b.typedFn("rmsnorm_backward", di.dt); ok && sameDT(di.dt, g, i, w) && C%vecN(di.dt) == 0 &&
			aligned16(di.p, g.p, i.p, w.p) {
			q.launch(f, rows(N), block, aPtr(di.p), aPtr(g.p), aPtr(i.p), aPtr(w.p), aPtr(rp), aI32(N), aI32(C))
		} else {
			q.launch(b.fn("rmsnorm_backward"), rows(N), block, aPtr(di.p), aDT(di.dt), aPtr(g.p), aDT(g.dt),
				aPtr(i.p), aDT(i.dt), aPtr(w.p), aDT(w.dt), aPtr(rp), aI32(N), aI32(C))
		}
	}
	partFn, typedPart := b.typedFn("rmsnorm_dw_partial", g.dt)
	typedPart = typedPart && i.dt == g.dt && C%vecN(g.dt) == 0 && aligned16(g.p, i.p)
	cols := C // columns (typed: vectors of columns) per row
	if typedPart {
		cols = C / vecN(g.dt)
	}
	var pgrid dim3
	pgrid.x = (cols + 31) / 32
	rpc := max(8, (N*pgrid.x+511)/512) // rows per chunk: about 512 blocks
	pgrid.y = (N + rpc - 1) / rpc
	// The partial sums at offset 0 of the scratch area.
	need := int64(pgrid.y) * int64(C) * 4
	part := launchJob(b.fn("rmsnorm_dw_partial"), pgrid, dim3{x: 32, y: 8}, 0, aPtr(g.p), aDT(g.dt), aPtr(i.p), aDT(i.dt),
		aPtr(rp), aI32(N), aI32(C), aI32(rpc)).withScratch(need, 0)
	if typedPart {
		part = launchJob(partFn, pgrid, dim3{x: 32, y: 8}, 0, aPtr(g.p), aPtr(i.p), aPtr(rp), aI32(N), aI32(C),
			aI32(rpc)).withScratch(need, 0)
	}
	js := [...]job{
		part,
		launchJob(b.fn("rmsnorm_dw_final"), dim3{x: (C + 31) / 32}, dim3{x: 32, y: 32}, aPtr(dw.p), aDT(dw.dt), 0,
			aI32(pgrid.y), aI32(C)).withScratch(need, 2),
	}
	q.putGroup(js[:])
}

// RoPE modes of rope_forward (kernels/llama.cu).
const (
	ropeFwd    = 0 // out = R·inp
	ropeBwdSet = 1 // out = Rᵀ·inp
	ropeBwdAcc = 2 // out += Rᵀ·inp
)

// RoPEForward implements kernels.LlamaOps.
func (b *Backend) RoPEForward(kq kernels.Queue, out, inp, table kernels.Tensor, B, T, NH, NKV, hs int) {
	b.rope("RoPEForward", kq, out, inp, table, B, T, NH, NKV, hs, ropeFwd)
}

// RoPEBackward implements kernels.LlamaOps.
func (b *Backend) RoPEBackward(kq kernels.Queue, dinp, dout, table kernels.Tensor, B, T, NH, NKV, hs int) {
	b.rope("RoPEBackward", kq, dinp, dout, table, B, T, NH, NKV, hs, ropeBwdAcc)
}

// RoPEBackwardSet implements kernels.LlamaOps.
func (b *Backend) RoPEBackwardSet(kq kernels.Queue, dinp, dout, table kernels.Tensor, B, T, NH, NKV, hs int) {
	b.rope("RoPEBackwardSet", kq, dinp, dout, table, B, T, NH, NKV, hs, ropeBwdSet)
}

// rope launches rope_forward (typed when out and inp share a dtype): one
// thread per element pair. In place (out is inp, not accumulating) the
// value heads are skipped, since they would be copied onto themselves.
func (b *Backend) rope(op string, kq kernels.Queue, out, inp, table kernels.Tensor, B, T, NH, NKV, hs, mode int) {
	q := b.queue(kq)
	W := gqaDims(op, B, T, NH, NKV, hs)
	if hs%2 != 0 {
		panic(fmt.Sprintf("kernels/cuda: %s: head size %d is odd", op, hs))
	}
	n := B * T * W
	o := b.float(op, "out", out, n)
	x := b.float(op, "inp", inp, n)
	tab := b.typed(op, "table", table, kernels.F32, T*hs)
	o1, x1 := out.Slice(0, n), inp.Slice(0, n)
	same := o1 == x1
	if overlap(o1, x1) && (mode == ropeBwdAcc || !same) {
		panic(fmt.Sprintf("kernels/cuda: %s: the output overlaps the input (only exactly the same tensor is allowed, and not when accumulating)", op))
	}
	nh := NH + 2*NKV
	if same {
		nh = NH + NKV
	}
	pairs := B * T * nh * (hs / 2)
	if f, ok := b.typedFn("rope_forward", o.dt); ok && x.dt == o.dt {
		q.launch(f, elems(pairs), block, aPtr(o.p), aPtr(x.p), aPtr(tab), aI32(B), aI32(T), aI32(NH), aI32(NKV),
			aI32(hs), aI32(nh), aI32(mode))
		return
	}
	q.launch(b.fn("rope_forward"), elems(pairs), block, aPtr(o.p), aDT(o.dt), aPtr(x.p), aDT(x.dt), aPtr(tab),
		aI32(B), aI32(T), aI32(NH), aI32(NKV), aI32(hs), aI32(nh), aI32(mode))
}

// SwiGLUForward implements kernels.LlamaOps.
func (b *Backend) SwiGLUForward(kq kernels.Queue, out, gate, up kernels.Tensor, N int) {
	q := b.queue(kq)
	const op = "SwiGLUForward"
	llamaDims(op, N)
	o, g, u := b.float(op, "out", out, N), b.float(op, "gate", gate, N), b.float(op, "up", up, N)
	if f, ok := b.typedFn("swiglu_forward", o.dt); ok && sameDT(o.dt, g, u) && alignedLike(o.dt.Size(), o.p, g.p, u.p) {
		q.launch(f, vecGrid(N, o.dt), block, aPtr(o.p), aPtr(g.p), aPtr(u.p), aI64(int64(N)))
		return
	}
	q.launch(b.fn("swiglu_forward"), elems(N), block, aPtr(o.p), aDT(o.dt), aPtr(g.p), aDT(g.dt), aPtr(u.p), aDT(u.dt),
		aI64(int64(N)))
}

// SwiGLUBackward implements kernels.LlamaOps.
func (b *Backend) SwiGLUBackward(kq kernels.Queue, dgate, dup, dout, gate, up kernels.Tensor, N int) {
	q := b.queue(kq)
	const op = "SwiGLUBackward"
	llamaDims(op, N)
	dg, du := b.float(op, "dgate", dgate, N), b.float(op, "dup", dup, N)
	y := b.float(op, "dout", dout, N)
	g, u := b.float(op, "gate", gate, N), b.float(op, "up", up, N)
	if f, ok := b.typedFn("swiglu_backward", dg.dt); ok && sameDT(dg.dt, du, y, g, u) &&
		alignedLike(dg.dt.Size(), dg.p, du.p, y.p, g.p, u.p) {
		q.launch(f, vecGrid(N, dg.dt), block, aPtr(dg.p), aPtr(du.p), aPtr(y.p), aPtr(g.p), aPtr(u.p), aI64(int64(N)))
		return
	}
	q.launch(b.fn("swiglu_backward"), elems(N), block, aPtr(dg.p), aDT(dg.dt), aPtr(du.p), aDT(du.dt), aPtr(y.p), aDT(y.dt),
		aPtr(g.p), aDT(g.dt), aPtr(u.p), aDT(u.dt), aI64(int64(N)))
}

// gqaCheck is gqaDims plus the head-size limit of the row-wise kernels.
func gqaCheck(op string, B, T, NH, NKV, hs int) int {
	W := gqaDims(op, B, T, NH, NKV, hs)
	if hs > maxHeadSize {
		panic(fmt.Sprintf("kernels/cuda: %s: head size %d above %d", op, hs, maxHeadSize))
	}
	return W
}

// GQAttentionForward implements kernels.LlamaOps. With NKV = NH it is
// AttentionForward; otherwise the flash kernel where it applies (bf16, head
// size 64, 80, 96 or 128, as for AttentionForward), else gqa_attention_forward,
// one warp per query row.
func (b *Backend) GQAttentionForward(kq kernels.Queue, out, lse, qkv kernels.Tensor, B, T, NH, NKV, hs int) {
	const op = "GQAttentionForward"
	W := gqaCheck(op, B, T, NH, NKV, hs)
	if NKV == NH {
		b.AttentionForward(kq, out, lse, qkv, B, T, NH*hs, NH)
		return
	}
	q := b.queue(kq)
	o := b.float(op, "out", out, B*T*NH*hs)
	l := b.typed(op, "lse", lse, kernels.F32, B*NH*T)
	x := b.float(op, "qkv", qkv, B*T*W)
	impl := attnImpl
	flash, frows, useFlash := b.flashFunc(o, x, B, NH, hs)
	if useFlash && (impl == attnFlash || impl == attnAuto && b.flashErr == nil) {
		flashLaunches.Add(1)
		if !b.countFlashSM90(flash) && frows == flashRows2 {
			flashFwd2Launches.Add(1)
		}
		j := flashJob(flash, frows, o.p, l, x.p, B, T, NH, NKV, hs)
		q.put(&j)
		return
	}
	q.launch(b.fn("gqa_attention_forward"), rows(B*NH*T), block, aPtr(o.p), aDT(o.dt), aPtr(l), aPtr(x.p), aDT(x.dt),
		aI32(B), aI32(T), aI32(NH), aI32(NKV), aI32(hs))
}

// GQAttentionBackward implements kernels.LlamaOps. With NKV = NH it is
// AttentionBackward; otherwise the flash backward kernels where they
// apply, else gqa_attention_backward (dQ and D, one warp per query row)
// and gqa_attention_backward_kv (dK and dV, one warp per key row, summing
// over the group's query heads in order), with D in the scratch area.
// The row-wise kernels and the split flash kernels use no atomics: their
// result does not depend on scheduling; the fused flash kernel (the
// default, flash.go) sums dQ with float32 atomics, so its dQ may differ in
// the last bits from run to run.
func (b *Backend) GQAttentionBackward(kq kernels.Queue, dqkv, dout, qkv, out, lse kernels.Tensor, B, T, NH, NKV, hs int) {
	const op = "GQAttentionBackward"
	W := gqaCheck(op, B, T, NH, NKV, hs)
	if NKV == NH {
		b.AttentionBackward(kq, dqkv, dout, qkv, out, lse, B, T, NH*hs, NH)
		return
	}
	q := b.queue(kq)
	C := NH * hs
	d := b.float(op, "dqkv", dqkv, B*T*W)
	g := b.float(op, "dout", dout, B*T*C)
	x := b.float(op, "qkv", qkv, B*T*W)
	o := b.float(op, "out", out, B*T*C)
	l := b.typed(op, "lse", lse, kernels.F32, B*NH*T)
	impl := attnImpl
	fb, useFlash := b.flashBwdFuncs(d, g, x, o, B, T, NH, hs)
	if useFlash && (impl == attnFlash || impl == attnAuto && b.flashBwdErr == nil) {
		flashBwdLaunches.Add(1)
		q.putFlashBwd(fb, impl == attnFlash, d.p, g.p, x.p, o.p, l, B, T, NH, NKV, hs, false)
		return
	}
	// D(B,NH,T) at offset 0 of the scratch area (argument 2 of both).
	need := int64(B) * int64(NH) * int64(T) * 4
	js := [...]job{
		launchJob(b.fn("gqa_attention_backward"), rows(B*NH*T), block, aPtr(d.p), aDT(d.dt), 0, aPtr(g.p), aDT(g.dt),
			aPtr(x.p), aDT(x.dt), aPtr(o.p), aDT(o.dt), aPtr(l), aI32(B), aI32(T), aI32(NH), aI32(NKV), aI32(hs)).withScratch(need, 2),
		launchJob(b.fn("gqa_attention_backward_kv"), rows(B*NKV*T), block, aPtr(d.p), aDT(d.dt), 0, aPtr(g.p), aDT(g.dt),
			aPtr(x.p), aDT(x.dt), aPtr(l), aI32(B), aI32(T), aI32(NH), aI32(NKV), aI32(hs)).withScratch(need, 2),
	}
	q.putGroup(js[:])
}
