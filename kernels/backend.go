// Package kernels defines the compute backend that the rest of spill runs on:
// device memory with explicit ownership and a hard budget, ordered queues of
// asynchronous work (CUDA streams; goroutines on the CPU backend), copies
// between host and device, and the neural-network ops the engine needs.
//
// Two backends implement it: kernels/cpu (pure Go, the default build and the
// reference every other backend is checked against) and kernels/cuda (build
// tag cuda). Backends register themselves with Register and are opened by
// name with Open, so the engine, the offload scheduler and the stream layer
// are written once against this package.
//
// # Asynchrony
//
// Every method that takes a Queue only enqueues work: it may return before
// the work has run. Work on one queue runs in the order it was enqueued;
// work on different queues is unordered unless ordered with events
// (RecordEvent on one queue, WaitEvent on another). Host memory handed to a
// copy must stay valid and unchanged (source) or untouched (destination)
// until the queue has passed the copy, which the caller learns from
// Queue.Synchronize or Event.Synchronize.
//
// Errors from enqueued work are sticky: the first one is returned by the next
// Synchronize of that queue (or of an event recorded after it). Misuse that
// is a programming error (mismatched sizes, wrong dtypes) panics at enqueue
// time.
package kernels

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// Buffer is a block of device memory returned by Backend.Alloc. The caller
// that allocated it owns it and must call Backend.Free exactly once, after
// every queue that uses it has passed its last use.
type Buffer interface {
	// Size is the usable size in bytes (what was requested).
	Size() int64
	// Tag is the purpose given at allocation ("weights", "grads", ...),
	// used in memory statistics and budget errors.
	Tag() string
}

// Tensor is a typed, contiguous view of elements in a Buffer. Shapes are
// not stored: ops take their dimensions as arguments, llm.c style, and
// panic if a Tensor holds fewer elements than the dimensions need.
// The zero Tensor means "absent" where an op documents an optional operand.
type Tensor struct {
	Buf   Buffer
	Off   int64 // byte offset of element 0 in Buf
	DType DType
	N     int // number of elements
}

// Bytes is the size of the view in bytes.
func (t Tensor) Bytes() int64 { return int64(t.N) * int64(t.DType.Size()) }

// IsZero reports whether t is the absent (zero) Tensor.
func (t Tensor) IsZero() bool { return t.Buf == nil }

// Slice returns the view of n elements starting at element start.
func (t Tensor) Slice(start, n int) Tensor {
	if start < 0 || n < 0 || start+n > t.N {
		panic(fmt.Sprintf("kernels: slice [%d:%d] of tensor with %d elements", start, start+n, t.N))
	}
	return Tensor{Buf: t.Buf, Off: t.Off + int64(start)*int64(t.DType.Size()), DType: t.DType, N: n}
}

// View returns a Tensor of n elements of dtype dt at byte offset off of b.
func View(b Buffer, off int64, dt DType, n int) Tensor {
	t := Tensor{Buf: b, Off: off, DType: dt, N: n}
	if off < 0 || off+t.Bytes() > b.Size() {
		panic(fmt.Sprintf("kernels: view [%d, %d) outside buffer of %d bytes", off, off+t.Bytes(), b.Size()))
	}
	return t
}

// Queue is an ordered stream of device work: a CUDA stream, or on the CPU
// backend a goroutine that runs enqueued work in order.
type Queue interface {
	// Name identifies the queue in traces ("compute", "h2d", "d2h").
	Name() string
	// Synchronize blocks until all work enqueued so far has finished and
	// returns the first error that any of it hit. It returns ctx.Err() if
	// ctx is done first; the work still completes in the background.
	Synchronize(ctx context.Context) error
}

// Event marks a point in a queue (Backend.RecordEvent).
type Event interface {
	// Synchronize blocks until the queue has passed the event.
	Synchronize(ctx context.Context) error
	// Done reports, without blocking, whether the queue has passed the event.
	Done() bool
}

// MemStats describes a backend's device memory.
type MemStats struct {
	Limit     int64 // hard budget in bytes; 0 means the device's capacity
	Allocated int64 // bytes currently allocated
	Peak      int64 // high-water mark of Allocated since Open or ResetPeak
	Allocs    int64 // number of successful Alloc calls
	Frees     int64 // number of Free calls
	Failed    int64 // number of Alloc calls refused for the budget
	// ByTag is the bytes currently allocated per Buffer tag.
	ByTag map[string]int64
}

// ErrOutOfMemory is wrapped by every error an allocation returns because a
// budget would be exceeded.
var ErrOutOfMemory = errors.New("kernels: out of device memory")

// OOMError reports an allocation that would exceed the device budget.
type OOMError struct {
	Requested int64            // bytes asked for
	Tag       string           // the tag of the refused allocation
	Allocated int64            // bytes held at the time
	Limit     int64            // the budget
	ByTag     map[string]int64 // what was held, per tag
}

func (e *OOMError) Error() string {
	tags := make([]string, 0, len(e.ByTag))
	for t := range e.ByTag {
		tags = append(tags, t)
	}
	sort.Strings(tags)
	s := fmt.Sprintf("kernels: out of device memory: %s for %q does not fit: %s of %s held",
		FormatBytes(e.Requested), e.Tag, FormatBytes(e.Allocated), FormatBytes(e.Limit))
	for i, t := range tags {
		if i == 0 {
			s += " ("
		} else {
			s += ", "
		}
		s += fmt.Sprintf("%s %s", t, FormatBytes(e.ByTag[t]))
		if i == len(tags)-1 {
			s += ")"
		}
	}
	return s
}

func (e *OOMError) Unwrap() error { return ErrOutOfMemory }

// Config configures a backend when it is opened.
type Config struct {
	// MemoryLimit is the device memory budget in bytes. On the CPU backend
	// it is required to simulate a device (0 means unlimited); on CUDA, 0
	// means the device's free memory at open.
	MemoryLimit int64
	// Threads bounds the host threads a CPU backend uses for one op; 0
	// means runtime.GOMAXPROCS(0).
	Threads int
	// Device selects the device ordinal for multi-device backends.
	Device int
}

// Backend is a compute device. All methods are safe for concurrent use.
type Backend interface {
	Ops

	// Name is the registered backend name ("cpu", "cuda").
	Name() string
	// DeviceName describes the device ("NVIDIA H200", "cpu (2 threads)").
	DeviceName() string

	// Alloc returns n bytes of device memory, zeroed, tagged with its
	// purpose. It fails with an error wrapping ErrOutOfMemory (an
	// *OOMError) when the budget would be exceeded; it never overshoots.
	Alloc(n int64, tag string) (Buffer, error)
	// Free releases b. The caller must ensure no queued work still uses it.
	Free(b Buffer)
	// MemStats returns a snapshot of the memory statistics.
	MemStats() MemStats
	// ResetPeak sets MemStats.Peak to the current allocation.
	ResetPeak()

	// DefaultQueue is the queue work runs on unless told otherwise.
	DefaultQueue() Queue
	// NewQueue creates another queue (stream), named for traces.
	NewQueue(name string) (Queue, error)
	// RecordEvent marks the current end of q.
	RecordEvent(q Queue) (Event, error)
	// WaitEvent makes work enqueued on q after this call wait for e.
	WaitEvent(q Queue, e Event) error

	// CopyToDevice enqueues a copy of len(src) bytes from host memory into
	// dst (which must be exactly that size).
	CopyToDevice(q Queue, dst Tensor, src []byte)
	// CopyToHost enqueues a copy of src into host memory dst (exactly
	// src.Bytes() long).
	CopyToHost(q Queue, dst []byte, src Tensor)
	// CopyDevice enqueues a device-to-device copy of equal-sized tensors.
	CopyDevice(q Queue, dst, src Tensor)

	// Close waits for all queues and releases the device. Buffers still
	// allocated are freed.
	Close() error
}

// Ops are the neural-network kernels. Conventions, for every op:
//
//   - Shapes are row-major and given in the doc comment, e.g. inp(BT,C).
//   - Floating-point operands may be F32, BF16 or F16 unless the comment
//     says otherwise; arithmetic accumulates in float32 and results are
//     rounded once, to nearest even, into the output's dtype.
//   - Every Backward accumulates (+=) into all of its gradient outputs,
//     activation and parameter gradients alike; the caller zeroes them
//     (Zero) when a new accumulation starts. This lets residual branches
//     and gradient accumulation across micro-batches share buffers.
//   - An optional operand (bias) may be the zero Tensor.
type Ops interface {
	// Zero sets every element of t to 0.
	Zero(q Queue, t Tensor)
	// Fill sets every element of t to v (rounded to t's dtype).
	Fill(q Queue, t Tensor, v float32)
	// Cast converts src into dst (same N), any float dtype to any, rounding
	// to nearest even; NaN, Inf and subnormals behave as on the hardware.
	Cast(q Queue, dst, src Tensor)
	// Add computes dst(N) += src(N).
	Add(q Queue, dst, src Tensor)
	// Scale computes t(N) *= s.
	Scale(q Queue, t Tensor, s float32)

	// MatmulForward computes out(BT,OC) = inp(BT,C) · weight(OC,C)ᵀ + bias(OC).
	MatmulForward(q Queue, out, inp, weight, bias Tensor, BT, C, OC int)
	// MatmulBackward accumulates dinp(BT,C) += dout(BT,OC)·weight(OC,C),
	// dweight(OC,C) += dout(BT,OC)ᵀ·inp(BT,C) and dbias(OC) += Σ_rows dout.
	// dinp or dbias may be the zero Tensor to skip them.
	MatmulBackward(q Queue, dinp, dweight, dbias, dout, inp, weight Tensor, BT, C, OC int)

	// EncoderForward computes out(B,T,C) = wte[tokens[b,t]] + wpe[t], with
	// tokens(B,T) of dtype I32, wte(V,C) and wpe(maxT,C).
	EncoderForward(q Queue, out, tokens, wte, wpe Tensor, B, T, C int)
	// EncoderBackward accumulates into dwte(V,C) and dwpe(maxT,C) from dout(B,T,C).
	EncoderBackward(q Queue, dwte, dwpe, dout, tokens Tensor, B, T, C int)

	// LayerNormForward normalises each row of inp(N,C) and computes
	// out = (inp-mean)*rstd*weight(C) + bias(C), saving mean(N) and rstd(N)
	// (both F32) for the backward pass. eps is 1e-5.
	LayerNormForward(q Queue, out, mean, rstd, inp, weight, bias Tensor, N, C int)
	// LayerNormBackward accumulates dinp(N,C), dweight(C), dbias(C).
	LayerNormBackward(q Queue, dinp, dweight, dbias, dout, inp, weight, mean, rstd Tensor, N, C int)

	// GeluForward computes out(N) = gelu(inp) with the tanh approximation.
	GeluForward(q Queue, out, inp Tensor, N int)
	// GeluBackward accumulates dinp(N) += gelu'(inp)·dout.
	GeluBackward(q Queue, dinp, inp, dout Tensor, N int)

	// AttentionForward is causal multi-head self-attention over
	// qkv(B,T,3C) laid out [q | k | v] per token, NH heads of C/NH each,
	// scaled by 1/sqrt(C/NH). It writes out(B,T,C) and the log-sum-exp of
	// each attention row, lse(B,NH,T) (F32), which is all the backward pass
	// needs besides qkv and out (flash-attention style: the T×T attention
	// matrix is never stored).
	AttentionForward(q Queue, out, lse, qkv Tensor, B, T, C, NH int)
	// AttentionBackward accumulates dqkv(B,T,3C) from dout(B,T,C).
	AttentionBackward(q Queue, dqkv, dout, qkv, out, lse Tensor, B, T, C, NH int)

	// CrossEntropyForward computes losses(BT) (F32) = -log softmax(logits(BT,V))[target]
	// with targets(BT) of dtype I32. A negative target is ignored: its loss is 0.
	CrossEntropyForward(q Queue, losses, logits, targets Tensor, BT, V int)
	// CrossEntropyBackward accumulates dlogits(BT,V) += scale·(softmax(logits) - onehot(target))
	// for rows whose target is not negative. scale is typically
	// lossScale / (number of non-ignored targets in the whole batch).
	CrossEntropyBackward(q Queue, dlogits, logits, targets Tensor, BT, V int, scale float32)

	// MSEForward computes losses(N) (F32) = (pred(N)-target(N))² / 2 with
	// target F32.
	MSEForward(q Queue, losses, pred, target Tensor, N int)
	// MSEBackward accumulates dpred(N) += scale·(pred-target).
	MSEBackward(q Queue, dpred, pred, target Tensor, N int, scale float32)

	// AdamW updates master parameters param(N) (F32) in place from grad(N)
	// (any float dtype, multiplied by p.GradScale first) and the moments
	// m(N), v(N) (F32), with bias correction for step p.Step (1-based) and
	// decoupled weight decay. If out is not the zero Tensor, the updated
	// parameters are also written to it (N elements, rounded to its dtype:
	// the compute-dtype copy of the weights).
	AdamW(q Queue, param, grad, m, v, out Tensor, p AdamWParams)

	// SumSquaresFinite accumulates out[0] += Σ x² and sets out[1] = 1 if
	// any element of x is NaN or ±Inf (it never clears it); out is F32 with
	// at least two elements. One pass over x gives a gradient's share of
	// the global norm and of the skip-step check.
	SumSquaresFinite(q Queue, out, x Tensor)
}

// Overwriter is implemented by backends that can write, instead of
// accumulate, the input gradient of the backward ops a layer chains: each
// method equals Zero on that gradient followed by the accumulating op
// (0 + x rounds to x), but saves writing the zeros and reading them back.
// Every other gradient output still accumulates. Callers use the package
// functions below, which fall back to Zero and the accumulating op.
type Overwriter interface {
	// MatmulBackwardSet is MatmulBackward with dinp = dout·weight.
	MatmulBackwardSet(q Queue, dinp, dweight, dbias, dout, inp, weight Tensor, BT, C, OC int)
	// GeluBackwardSet computes dinp(N) = gelu'(inp)·dout.
	GeluBackwardSet(q Queue, dinp, inp, dout Tensor, N int)
	// AttentionBackwardSet is AttentionBackward with dqkv overwritten.
	AttentionBackwardSet(q Queue, dqkv, dout, qkv, out, lse Tensor, B, T, C, NH int)
	// CrossEntropyBackwardSet is CrossEntropyBackward with dlogits
	// overwritten (ignored rows get zeros).
	CrossEntropyBackwardSet(q Queue, dlogits, logits, targets Tensor, BT, V int, scale float32)
}

// GeluMatmuler is implemented by backends that fuse the GELU of an MLP
// into the GEMMs around it (CUDA: cuBLASLt's GELU_AUX_BIAS and DGELU
// epilogues). Each method is the unfused sequence in one op:
//
//	MatmulGeluForward:     MatmulForward(pre, inp, weight, bias), then GeluForward(out, pre)
//	MatmulBackwardGeluSet: MatmulBackwardSet(t, dweight, dbias, dout, inp, weight) into a
//	                       temporary t, then GeluBackwardSet(dinp, pre, t)
//
// where inp (BT, C) is gelu(pre) and dinp and pre are (BT, C). A fused
// form may round the intermediate differently (the GELU of the unrounded
// product): results agree within the dtype's rounding, not bit for bit.
// dinp, inp and pre are distinct tensors.
type GeluMatmuler interface {
	MatmulGeluForward(q Queue, out, pre, inp, weight, bias Tensor, BT, C, OC int)
	MatmulBackwardGeluSet(q Queue, dinp, dweight, dbias, dout, inp, weight, pre Tensor, BT, C, OC int)
}

// ResidualMatmuler is implemented by backends that add a residual in the
// GEMM's epilogue (CUDA: cuBLASLt with the residual as its C operand):
// MatmulForwardResidual(out, inp, weight, bias, res) is MatmulForward(out,
// inp, weight, bias) then Add(out, res), with out rounded once instead of
// twice (results agree within the dtype's rounding, not bit for bit). out
// and res are distinct tensors; bias may be the zero Tensor.
type ResidualMatmuler interface {
	MatmulForwardResidual(q Queue, out, inp, weight, bias, res Tensor, BT, C, OC int)
}

// MatmulForwardResidual computes out = inp·weightᵀ + bias + res on any
// backend: fused where it implements ResidualMatmuler, else MatmulForward
// then Add.
func MatmulForwardResidual(o Ops, q Queue, out, inp, weight, bias, res Tensor, BT, C, OC int) {
	if r, ok := o.(ResidualMatmuler); ok {
		r.MatmulForwardResidual(q, out, inp, weight, bias, res, BT, C, OC)
		return
	}
	o.MatmulForward(q, out, inp, weight, bias, BT, C, OC)
	o.Add(q, out, res)
}

// MatmulBackwardSet overwrites dinp (see Overwriter) on any backend.
func MatmulBackwardSet(o Ops, q Queue, dinp, dweight, dbias, dout, inp, weight Tensor, BT, C, OC int) {
	if w, ok := o.(Overwriter); ok {
		w.MatmulBackwardSet(q, dinp, dweight, dbias, dout, inp, weight, BT, C, OC)
		return
	}
	o.Zero(q, dinp)
	o.MatmulBackward(q, dinp, dweight, dbias, dout, inp, weight, BT, C, OC)
}

// GeluBackwardSet overwrites dinp (see Overwriter) on any backend.
func GeluBackwardSet(o Ops, q Queue, dinp, inp, dout Tensor, N int) {
	if w, ok := o.(Overwriter); ok {
		w.GeluBackwardSet(q, dinp, inp, dout, N)
		return
	}
	o.Zero(q, dinp)
	o.GeluBackward(q, dinp, inp, dout, N)
}

// AttentionBackwardSet overwrites dqkv (see Overwriter) on any backend.
func AttentionBackwardSet(o Ops, q Queue, dqkv, dout, qkv, out, lse Tensor, B, T, C, NH int) {
	if w, ok := o.(Overwriter); ok {
		w.AttentionBackwardSet(q, dqkv, dout, qkv, out, lse, B, T, C, NH)
		return
	}
	o.Zero(q, dqkv)
	o.AttentionBackward(q, dqkv, dout, qkv, out, lse, B, T, C, NH)
}

// CrossEntropyBackwardSet overwrites dlogits (see Overwriter) on any backend.
func CrossEntropyBackwardSet(o Ops, q Queue, dlogits, logits, targets Tensor, BT, V int, scale float32) {
	if w, ok := o.(Overwriter); ok {
		w.CrossEntropyBackwardSet(q, dlogits, logits, targets, BT, V, scale)
		return
	}
	o.Zero(q, dlogits)
	o.CrossEntropyBackward(q, dlogits, logits, targets, BT, V, scale)
}

// AdamWParams are the hyper-parameters of one AdamW step.
type AdamWParams struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	// Step is the 1-based step number for bias correction.
	Step int
	// GradScale multiplies every gradient before use (1/lossScale times the
	// clipping coefficient); 0 means 1.
	GradScale float32
}

// Opener opens a backend.
type Opener func(Config) (Backend, error)

var (
	regMu    sync.Mutex
	registry = map[string]Opener{}
)

// Register makes a backend available to Open under name. It is called from
// the init function of the backend's package; it panics on a duplicate.
func Register(name string, open Opener) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("kernels: Register called twice for backend " + name)
	}
	registry[name] = open
}

// Backends lists the registered backend names, sorted.
func Backends() []string {
	regMu.Lock()
	defer regMu.Unlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Open opens the backend registered under name.
func Open(name string, cfg Config) (Backend, error) {
	regMu.Lock()
	open, ok := registry[name]
	regMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("kernels: unknown backend %q (built in: %v)", name, Backends())
	}
	return open(cfg)
}
