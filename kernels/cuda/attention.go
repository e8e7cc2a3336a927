//go:build cuda

package cuda

import (
	"fmt"
	"math"

	"github.com/spill-ml/spill/kernels"
	"gorgonia.org/cu"
)

// Attention runs one of three implementations, chosen per call (and, for
// bf16 with head size 64, 80, 96 or 128, a fourth ahead of them: the tensor-core
// flash kernels of flash.go, forward and backward):
//
//   - gemm (the default): the products QKᵀ, PV and the five of the
//     backward pass as cuBLAS strided-batched GEMMs on the tensor cores,
//     with float32 scores and float32 accumulation, and small kernels for
//     the causal softmax, its backward and the layout changes
//     (kernels/attngemm.cu). Query rows go in blocks of attnQBlock, each
//     against only the keys at or before its last row, so causality saves
//     about 7/16 of the work at T = 1024. The score matrices live in a
//     per-queue workspace (tag "attention"), at most attnChunkBytes of
//     score blocks at a time plus head-major copies of Q, K, V, dO and
//     float32 dQ, dK, dV; the contract's saved state is still lse alone,
//     since the backward pass recomputes the scores from Q and K.
//   - tiled: flash-style CUDA-core kernels with shared-memory tiles
//     (head size <= tiledHeadSize); used when the workspace does not fit
//     the memory budget.
//   - rowwise: one warp per row, any head size up to maxHeadSize.

// maxHeadSize is the largest C/NH the attention kernels hold in registers;
// up to tiledHeadSize the shared-memory tiled kernels run.
const (
	maxHeadSize   = 256
	tiledHeadSize = 128
)

// Attention implementations (attnImpl).
const (
	attnAuto    = iota // gemm, falling back to tiled, then rowwise
	attnTiled          // tiled where it applies, else rowwise
	attnRowwise        // rowwise only
	attnFlash          // the flash kernels wherever they apply, even if their self-check failed; else as attnAuto
	attnNoFlash        // attnAuto without the flash kernels
)

// attnImpl selects the implementation; tests set it to check each one.
var attnImpl = attnAuto

// attnQBlock is the number of query rows per score block and
// attnChunkBytes the most workspace the score blocks of one round take;
// tests shrink them to exercise the blocking.
var (
	attnQBlock     = 128
	attnChunkBytes = int64(1 << 30)
)

func useTiled(B, C, NH int) bool {
	return attnImpl != attnRowwise && C/NH <= tiledHeadSize && B*NH <= 65535
}

func attnCheck(op string, B, T, C, NH int) {
	needDims(op, B, T, C, NH)
	if NH <= 0 || C%NH != 0 {
		panic(fmt.Sprintf("kernels/cuda: %s: C=%d is not a multiple of NH=%d", op, C, NH))
	}
	if C/NH > maxHeadSize {
		panic(fmt.Sprintf("kernels/cuda: %s: head size %d above %d", op, C/NH, maxHeadSize))
	}
}

// attnPlan is the workspace layout of one gemm-path call.
type attnPlan struct {
	B, T, C, NH, hs, Z int
	wd                 kernels.DType // dtype of the head-major copies and of P, dS
	tq, nz             int           // query rows per block, heads per round
	scale              float32

	q, k, v, x    cu.DevicePtr // x: O (float32) forward, dO (wd) backward
	dq, dk, dv, d cu.DevicePtr // float32, backward only
	s, dp, p, ds  cu.DevicePtr // score blocks; dp and ds backward only
	total         int64
}

func align256(n int64) int64 { return (n + 255) &^ 255 }

// planAttention lays out the workspace for a forward (bwd false) or
// backward call; pointers are offsets until place is called.
// chunk bounds the bytes of score blocks per round.
func planAttention(B, T, C, NH int, wd kernels.DType, bwd bool, chunk int64) attnPlan {
	hs := C / NH
	p := attnPlan{B: B, T: T, C: C, NH: NH, hs: hs, Z: B * NH, wd: wd, scale: float32(1 / math.Sqrt(float64(hs)))}
	p.tq = min(attnQBlock, T)
	w := int64(wd.Size())
	perScore := 4 + w // S (f32) and P
	if bwd {
		perScore = 8 + 2*w // S, dP (f32), P, dS
	}
	perZ := int64(p.tq) * int64(T) * perScore
	p.nz = int(min(int64(p.Z), max(1, chunk/perZ)))
	rounds := (p.Z + p.nz - 1) / p.nz
	p.nz = (p.Z + rounds - 1) / rounds
	head := int64(p.Z) * int64(T) * int64(hs)
	off := int64(0)
	take := func(n int64) cu.DevicePtr {
		o := off
		off += align256(n)
		return cu.DevicePtr(o)
	}
	p.q, p.k, p.v = take(head*w), take(head*w), take(head*w)
	p.x = take(head * 4)
	if bwd {
		p.dq, p.dk, p.dv, p.d = take(head*4), take(head*4), take(head*4), take(int64(p.Z)*int64(T)*4)
	}
	blk := int64(p.nz) * int64(p.tq) * int64(T)
	p.s, p.p = take(blk*4), take(blk*w)
	if bwd {
		p.dp, p.ds = take(blk*4), take(blk*w)
	}
	p.total = off
	return p
}

// place turns the plan's offsets into addresses in the workspace at base.
func (p *attnPlan) place(base cu.DevicePtr) {
	for _, f := range []*cu.DevicePtr{&p.q, &p.k, &p.v, &p.x, &p.dq, &p.dk, &p.dv, &p.d, &p.s, &p.dp, &p.p, &p.ds} {
		*f += base
	}
}

// headOff is the byte offset of row t of head z in a head-major tensor of
// element size es.
func (p *attnPlan) headOff(z, t, es int) cu.DevicePtr {
	return cu.DevicePtr((int64(z)*int64(p.T) + int64(t)) * int64(p.hs) * int64(es))
}

// attnChunk is the score-block bytes per round: attnChunkBytes, but no
// more than 1/16 of the memory budget.
func (b *Backend) attnChunk() int64 { return min(attnChunkBytes, b.limit/16) }

// attnWorkspace returns at least n bytes of the queue's attention
// workspace, growing it under the budget; ok is false when the budget
// cannot hold it or it would take more than a quarter of the budget (the
// caller falls back to the tiled kernels, which need no workspace). Called
// on the queue's goroutine only.
func (q *queue) attnWorkspace(n int64) (p cu.DevicePtr, ok bool, err error) {
	if n <= q.attnN {
		return q.attn, true, nil
	}
	if n > q.b.limit/4 {
		return 0, false, nil
	}
	if q.attnN > 0 {
		// Work already queued may still use the old area.
		if err := q.stream.Synchronize(); err != nil {
			return 0, false, err
		}
		_ = cu.MemFree(q.attn)
		q.b.unreserve(q.attnN, "attention")
		q.attn, q.attnN = 0, 0
	}
	if q.b.reserve(n, "attention") != nil {
		return 0, false, nil
	}
	ptr, err := cu.MemAlloc(n)
	if err != nil {
		q.b.unreserve(n, "attention")
		return 0, false, nil // the device is fuller than the budget says: fall back
	}
	q.attn, q.attnN = ptr, n
	return ptr, true, nil
}

// AttentionForward is causal multi-head self-attention.
func (b *Backend) AttentionForward(kq kernels.Queue, out, lse, qkv kernels.Tensor, B, T, C, NH int) {
	q := b.queue(kq)
	const op = "AttentionForward"
	attnCheck(op, B, T, C, NH)
	if B*T*C == 0 {
		return
	}
	o := b.float(op, "out", out, B*T*C)
	l := b.typed(op, "lse", lse, kernels.F32, B*NH*T)
	x := b.float(op, "qkv", qkv, B*T*3*C)
	tiled := useTiled(B, C, NH)
	impl := attnImpl
	flash, frows, useFlash := b.flashFunc(o, x, B, NH, C/NH)
	useFlash = useFlash && (impl == attnFlash || impl == attnAuto && b.flashErr == nil)
	if useFlash {
		// Counted when enqueued, so that a test sees it without waiting
		// for the queue.
		flashLaunches.Add(1)
		if !b.countFlashSM90(flash) && frows == flashRows2 {
			flashFwd2Launches.Add(1)
		}
		j := flashJob(flash, frows, o.p, l, x.p, B, T, NH, NH, C/NH)
		q.put(&j)
		return
	}
	q.enqueue(func(q *queue) error {
		if impl == attnAuto || impl == attnFlash || impl == attnNoFlash {
			if done, err := q.attnForwardGEMM(o, l, x, B, T, C, NH); done || err != nil {
				return err
			}
		}
		if tiled {
			return q.launchNow(b.fn("attention_forward_tiled"), dim3{x: (T + 15) / 16, y: B * NH}, block, aPtr(o.p), aDT(o.dt),
				aPtr(l), aPtr(x.p), aDT(x.dt), aI32(B), aI32(T), aI32(C), aI32(NH))
		}
		return q.launchNow(b.fn("attention_forward"), rows(B*NH*T), block, aPtr(o.p), aDT(o.dt), aPtr(l), aPtr(x.p), aDT(x.dt),
			aI32(B), aI32(T), aI32(C), aI32(NH))
	})
}

// attnForwardGEMM runs the gemm implementation; done is false when its
// workspace does not fit.
func (q *queue) attnForwardGEMM(o operand, lse cu.DevicePtr, x operand, B, T, C, NH int) (done bool, err error) {
	b := q.b
	p := planAttention(B, T, C, NH, x.dt, false, q.b.attnChunk())
	base, ok, err := q.attnWorkspace(p.total)
	if !ok || err != nil {
		return false, err
	}
	p.place(base)
	h, err := q.blasHandle()
	if err != nil {
		return false, err
	}
	wd, w, hs := p.wd, p.wd.Size(), p.hs
	if err := q.launchNow(b.fn("attn_split"), elems(B*T*3*C), block, aPtr(p.q), aPtr(p.k), aPtr(p.v), aDT(wd),
		aPtr(x.p), aDT(x.dt), aI32(B), aI32(T), aI32(C), aI32(NH)); err != nil {
		return false, err
	}
	head := int64(T) * int64(hs)
	for z0 := 0; z0 < p.Z; z0 += p.nz {
		n := min(p.nz, p.Z-z0)
		for q0 := 0; q0 < T; q0 += p.tq {
			Tq := min(p.tq, T-q0)
			Tk := q0 + Tq
			blk := int64(Tq) * int64(Tk)
			// S(Tq,Tk) = scale·Q·Kᵀ; column-major Sᵀ(Tk,Tq) = Kᵀᵀ·Qᵀ.
			if err := h.gemmStridedBatched(true, false, Tk, Tq, hs, p.scale, p.k+p.headOff(z0, 0, w), wd, hs, head,
				p.q+p.headOff(z0, q0, w), wd, hs, head, 0, p.s, kernels.F32, Tk, blk, n); err != nil {
				return false, err
			}
			if err := q.launchNow(b.fn("attn_softmax_fwd"), rows(n*Tq), block, aPtr(p.s), aPtr(p.p), aDT(wd), aPtr(lse),
				aI32(n), aI32(Tq), aI32(Tk), aI32(q0), aI32(z0), aI32(T)); err != nil {
				return false, err
			}
			// O(Tq,hs) = P·V; column-major Oᵀ(hs,Tq) = Vᵀ·Pᵀ.
			if err := h.gemmStridedBatched(false, false, hs, Tq, Tk, 1, p.v+p.headOff(z0, 0, w), wd, hs, head,
				p.p, wd, Tk, blk, 0, p.x+p.headOff(z0, q0, 4), kernels.F32, hs, head, n); err != nil {
				return false, err
			}
		}
	}
	return true, q.launchNow(b.fn("attn_merge_out"), elems(B*T*C), block, aPtr(o.p), aDT(o.dt), aPtr(p.x), aDT(kernels.F32),
		aI32(B), aI32(T), aI32(C), aI32(NH))
}

// AttentionBackward accumulates dqkv from dout.
func (b *Backend) AttentionBackward(kq kernels.Queue, dqkv, dout, qkv, out, lse kernels.Tensor, B, T, C, NH int) {
	b.attentionBackward(kq, false, dqkv, dout, qkv, out, lse, B, T, C, NH)
}

// AttentionBackwardSet overwrites dqkv: the flash kernels write it without
// reading it; the other implementations run after a Zero.
// kernels.Overwriter.
func (b *Backend) AttentionBackwardSet(kq kernels.Queue, dqkv, dout, qkv, out, lse kernels.Tensor, B, T, C, NH int) {
	b.attentionBackward(kq, true, dqkv, dout, qkv, out, lse, B, T, C, NH)
}

func (b *Backend) attentionBackward(kq kernels.Queue, set bool, dqkv, dout, qkv, out, lse kernels.Tensor, B, T, C, NH int) {
	q := b.queue(kq)
	const op = "AttentionBackward"
	attnCheck(op, B, T, C, NH)
	if B*T*C == 0 {
		return
	}
	d := b.float(op, "dqkv", dqkv, B*T*3*C)
	g := b.float(op, "dout", dout, B*T*C)
	x := b.float(op, "qkv", qkv, B*T*3*C)
	o := b.float(op, "out", out, B*T*C)
	l := b.typed(op, "lse", lse, kernels.F32, B*NH*T)
	nrows := B * NH * T
	tiled := useTiled(B, C, NH)
	impl := attnImpl
	fb, useFlash := b.flashBwdFuncs(d, g, x, o, B, T, NH, C/NH)
	useFlash = useFlash && (impl == attnFlash || impl == attnAuto && b.flashBwdErr == nil)
	if useFlash {
		flashBwdLaunches.Add(1)
		q.putFlashBwd(fb, impl == attnFlash, d.p, g.p, x.p, o.p, l, B, T, NH, NH, C/NH, set)
		return
	}
	if set {
		b.Zero(kq, dqkv)
	}
	q.enqueue(func(q *queue) error {
		if impl == attnAuto || impl == attnFlash || impl == attnNoFlash {
			if done, err := q.attnBackwardGEMM(d, g, x, o, l, B, T, C, NH); done || err != nil {
				return err
			}
		}
		D, err := q.ensureScratch(int64(nrows) * 4)
		if err != nil {
			return err
		}
		if tiled {
			grid := dim3{x: (T + 7) / 8, y: B * NH}
			if err := q.launchNow(b.fn("attention_backward_tiled"), grid, block, aPtr(d.p), aDT(d.dt), aPtr(D), aPtr(g.p), aDT(g.dt),
				aPtr(x.p), aDT(x.dt), aPtr(o.p), aDT(o.dt), aPtr(l), aI32(B), aI32(T), aI32(C), aI32(NH)); err != nil {
				return err
			}
			return q.launchNow(b.fn("attention_backward_kv_tiled"), grid, block, aPtr(d.p), aDT(d.dt), aPtr(D), aPtr(g.p), aDT(g.dt),
				aPtr(x.p), aDT(x.dt), aPtr(l), aI32(B), aI32(T), aI32(C), aI32(NH))
		}
		if err := q.launchNow(b.fn("attention_backward"), rows(nrows), block, aPtr(d.p), aDT(d.dt), aPtr(D), aPtr(g.p), aDT(g.dt),
			aPtr(x.p), aDT(x.dt), aPtr(o.p), aDT(o.dt), aPtr(l), aI32(B), aI32(T), aI32(C), aI32(NH)); err != nil {
			return err
		}
		return q.launchNow(b.fn("attention_backward_kv"), rows(nrows), block, aPtr(d.p), aDT(d.dt), aPtr(D), aPtr(g.p), aDT(g.dt),
			aPtr(x.p), aDT(x.dt), aPtr(l), aI32(B), aI32(T), aI32(C), aI32(NH))
	})
}

// attnBackwardGEMM runs the gemm implementation of the backward pass;
// done is false when its workspace does not fit.
func (q *queue) attnBackwardGEMM(dqkv, dout, x, out operand, lse cu.DevicePtr, B, T, C, NH int) (done bool, err error) {
	b := q.b
	p := planAttention(B, T, C, NH, x.dt, true, q.b.attnChunk())
	base, ok, err := q.attnWorkspace(p.total)
	if !ok || err != nil {
		return false, err
	}
	p.place(base)
	h, err := q.blasHandle()
	if err != nil {
		return false, err
	}
	wd, w, hs := p.wd, p.wd.Size(), p.hs
	if err := q.launchNow(b.fn("attn_split"), elems(B*T*3*C), block, aPtr(p.q), aPtr(p.k), aPtr(p.v), aDT(wd),
		aPtr(x.p), aDT(x.dt), aI32(B), aI32(T), aI32(C), aI32(NH)); err != nil {
		return false, err
	}
	if err := q.launchNow(b.fn("attn_bwd_prep"), rows(p.Z*T), block, aPtr(p.x), aDT(wd), aPtr(p.d), aPtr(dout.p), aDT(dout.dt),
		aPtr(out.p), aDT(out.dt), aI32(B), aI32(T), aI32(C), aI32(NH)); err != nil {
		return false, err
	}
	head := int64(T) * int64(hs)
	nqb := (T + p.tq - 1) / p.tq
	for z0 := 0; z0 < p.Z; z0 += p.nz {
		n := min(p.nz, p.Z-z0)
		// Last query block first: it sees every key, so it initialises
		// dK and dV (beta 0) and the earlier blocks accumulate.
		for qb := nqb - 1; qb >= 0; qb-- {
			q0 := qb * p.tq
			Tq := min(p.tq, T-q0)
			Tk := q0 + Tq
			blk := int64(Tq) * int64(Tk)
			beta := float32(1)
			if qb == nqb-1 {
				beta = 0
			}
			kz, vz := p.k+p.headOff(z0, 0, w), p.v+p.headOff(z0, 0, w)
			qz, gz := p.q+p.headOff(z0, q0, w), p.x+p.headOff(z0, q0, w)
			// S = scale·Q·Kᵀ and dP = dO·Vᵀ, as Sᵀ(Tk,Tq) column-major.
			if err := h.gemmStridedBatched(true, false, Tk, Tq, hs, p.scale, kz, wd, hs, head, qz, wd, hs, head,
				0, p.s, kernels.F32, Tk, blk, n); err != nil {
				return false, err
			}
			if err := h.gemmStridedBatched(true, false, Tk, Tq, hs, 1, vz, wd, hs, head, gz, wd, hs, head,
				0, p.dp, kernels.F32, Tk, blk, n); err != nil {
				return false, err
			}
			if err := q.launchNow(b.fn("attn_softmax_bwd"), rows(n*Tq), block, aPtr(p.s), aPtr(p.dp), aPtr(p.p), aPtr(p.ds),
				aDT(wd), aPtr(lse), aPtr(p.d), aI32(n), aI32(Tq), aI32(Tk), aI32(q0), aI32(z0), aI32(T), aF32(p.scale)); err != nil {
				return false, err
			}
			// dV(Tk,hs) += Pᵀ·dO: dVᵀ(hs,Tk) = dOᵀ·P.
			if err := h.gemmStridedBatched(false, true, hs, Tk, Tq, 1, gz, wd, hs, head, p.p, wd, Tk, blk,
				beta, p.dv+p.headOff(z0, 0, 4), kernels.F32, hs, head, n); err != nil {
				return false, err
			}
			// dK(Tk,hs) += dSᵀ·Q: dKᵀ(hs,Tk) = Qᵀ·dS.
			if err := h.gemmStridedBatched(false, true, hs, Tk, Tq, 1, qz, wd, hs, head, p.ds, wd, Tk, blk,
				beta, p.dk+p.headOff(z0, 0, 4), kernels.F32, hs, head, n); err != nil {
				return false, err
			}
			// dQ(Tq,hs) = dS·K: dQᵀ(hs,Tq) = Kᵀ·dSᵀ.
			if err := h.gemmStridedBatched(false, false, hs, Tq, Tk, 1, kz, wd, hs, head, p.ds, wd, Tk, blk,
				0, p.dq+p.headOff(z0, q0, 4), kernels.F32, hs, head, n); err != nil {
				return false, err
			}
		}
	}
	return true, q.launchNow(b.fn("attn_merge_grad"), elems(B*T*3*C), block, aPtr(dqkv.p), aDT(dqkv.dt), aPtr(p.dq), aPtr(p.dk),
		aPtr(p.dv), aI32(B), aI32(T), aI32(C), aI32(NH))
}
