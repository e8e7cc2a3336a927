package kernels

import (
	"errors"
	"fmt"
	"math"
)

// LlamaOps are the kernels a Llama-family layer needs beyond Ops (the
// architecture of Hugging Face's LlamaForCausalLM): RMSNorm, rotary
// position embeddings, the SwiGLU activation and causal attention with
// grouped-query heads. A backend implements them when it can run Llama
// layers; callers find out with a type assertion:
//
//	lo, ok := be.(kernels.LlamaOps)
//
// The conventions of Ops hold for every method (shapes in the comments,
// F32, BF16 or F16 operands unless a comment says F32, float32 arithmetic
// with one rounding into each output, backward ops accumulating into their
// gradients).
//
// # Attention layout
//
// The attention and RoPE ops work on one packed projection per token,
// qkv(B,T,(NH+2·NKV)·hs): NH query heads, then NKV key heads, then NKV
// value heads, each hs wide, the layout of one matmul whose weight is
// q_proj, k_proj and v_proj stacked by rows. Query head h attends with key
// and value head h/(NH/NKV), as transformers' repeat_kv arranges them
// (NKV divides NH; NKV = NH is ordinary multi-head attention and the
// layout of AttentionForward with C = NH·hs).
type LlamaOps interface {
	// RMSNormForward computes, for each row of inp(N,C),
	// out = inp · rstd · weight(C) with rstd = 1/sqrt(mean(inp²) + eps),
	// and saves rstd(N) (F32) for the backward pass: transformers'
	// LlamaRMSNorm, except that the normalised row is not rounded to the
	// input dtype before the multiplication by weight (one rounding, at
	// the end).
	RMSNormForward(q Queue, out, rstd, inp, weight Tensor, N, C int, eps float32)
	// RMSNormBackward accumulates dinp(N,C) and dweight(C) from dout(N,C),
	// given the forward's inp, weight and rstd. dinp may be the zero
	// Tensor to skip it.
	RMSNormBackward(q Queue, dinp, dweight, dout, inp, weight, rstd Tensor, N, C int)

	// RoPEForward rotates the query and key heads of qkv(B,T,(NH+2·NKV)·hs)
	// by their token's position t (0 ≤ t < T) and writes the result to
	// out (same shape); the value heads are copied unchanged. Within a
	// head, element i pairs with element i+hs/2 (transformers'
	// rotate_half convention, not interleaved pairs):
	//
	//	out[i]      = inp[i]·cos[t,i] - inp[i+hs/2]·sin[t,i]
	//	out[i+hs/2] = inp[i+hs/2]·cos[t,i] + inp[i]·sin[t,i]
	//
	// for i < hs/2, with cos and sin read from table(≥T, hs) (F32; row t is
	// cos[t,0..hs/2) then sin[t,0..hs/2), as RoPEConfig.Table builds it).
	// hs must be even. out may be inp itself (in place); any other overlap
	// panics.
	RoPEForward(q Queue, out, inp, table Tensor, B, T, NH, NKV, hs int)
	// RoPEBackward accumulates into dinp(B,T,(NH+2·NKV)·hs) the inverse
	// rotation of dout (same shape): dinp += Rᵀ·dout on the query and key
	// heads, dinp += dout on the value heads. dinp and dout must not
	// overlap.
	RoPEBackward(q Queue, dinp, dout, table Tensor, B, T, NH, NKV, hs int)
	// RoPEBackwardSet is RoPEBackward with dinp overwritten (dinp = Rᵀ·dout);
	// dinp may be dout itself, which turns the attention's qkv gradient
	// into the projection's in place.
	RoPEBackwardSet(q Queue, dinp, dout, table Tensor, B, T, NH, NKV, hs int)

	// SwiGLUForward computes out(N) = silu(gate(N))·up(N), with
	// silu(x) = x/(1+exp(-x)): the activation of the Llama MLP, between
	// gate_proj and up_proj and down_proj.
	SwiGLUForward(q Queue, out, gate, up Tensor, N int)
	// SwiGLUBackward accumulates dgate(N) += dout·up·silu'(gate) and
	// dup(N) += dout·silu(gate).
	SwiGLUBackward(q Queue, dgate, dup, dout, gate, up Tensor, N int)

	// GQAttentionForward is causal self-attention with grouped-query
	// heads over qkv(B,T,(NH+2·NKV)·hs) (see the layout above), scaled by
	// 1/sqrt(hs). It writes out(B,T,NH·hs) and the log-sum-exp of each
	// attention row, lse(B,NH,T) (F32), as AttentionForward does.
	GQAttentionForward(q Queue, out, lse, qkv Tensor, B, T, NH, NKV, hs int)
	// GQAttentionBackward accumulates dqkv(B,T,(NH+2·NKV)·hs) from
	// dout(B,T,NH·hs), given the forward's qkv, out and lse. The key and
	// value gradients of a group sum over its NH/NKV query heads.
	GQAttentionBackward(q Queue, dqkv, dout, qkv, out, lse Tensor, B, T, NH, NKV, hs int)
}

// GQAWidth is the width of one token's packed projection,
// (NH+2·NKV)·hs: the last dimension of the qkv operand of LlamaOps.
func GQAWidth(NH, NKV, hs int) int { return (NH + 2*NKV) * hs }

// RoPEConfig describes a model's rotary position embedding: the config.json
// fields rope_theta and rope_scaling.
type RoPEConfig struct {
	// Theta is the base of the rotation frequencies (rope_theta): 10000
	// for Llama 2, 500000 for Llama 3.
	Theta float64
	// Scaling is the "llama3" frequency scaling of Llama 3.1 and later;
	// the zero value means none.
	Scaling RoPEScaling
}

// RoPEScaling is rope_scaling with rope_type "llama3": wavelengths shorter
// than OriginalMaxPositions/HighFreqFactor keep their frequency, those
// longer than OriginalMaxPositions/LowFreqFactor are divided by Factor, and
// those between are interpolated, linearly in OriginalMaxPositions/wavelength.
type RoPEScaling struct {
	Factor               float64 // factor: 8 in Llama 3.1, 32 in Llama 3.2
	LowFreqFactor        float64 // low_freq_factor: 1
	HighFreqFactor       float64 // high_freq_factor: 4
	OriginalMaxPositions int     // original_max_position_embeddings: 8192
}

// IsZero reports whether s is the zero value (no scaling).
func (s RoPEScaling) IsZero() bool { return s == RoPEScaling{} }

// Validate reports every problem of c for heads hs wide at once.
func (c RoPEConfig) Validate(hs int) error {
	var errs []error
	if hs <= 0 || hs%2 != 0 {
		errs = append(errs, fmt.Errorf("kernels: rope: head size %d must be even and positive", hs))
	}
	if !(c.Theta > 0) || math.IsInf(c.Theta, 0) {
		errs = append(errs, fmt.Errorf("kernels: rope: theta %v must be positive and finite", c.Theta))
	}
	if s := c.Scaling; !s.IsZero() {
		if !(s.Factor >= 1) || math.IsInf(s.Factor, 0) {
			errs = append(errs, fmt.Errorf("kernels: rope: llama3 scaling factor %v must be at least 1", s.Factor))
		}
		if !(s.LowFreqFactor > 0) {
			errs = append(errs, fmt.Errorf("kernels: rope: llama3 low_freq_factor %v must be positive", s.LowFreqFactor))
		}
		if !(s.HighFreqFactor > s.LowFreqFactor) {
			errs = append(errs, fmt.Errorf("kernels: rope: llama3 high_freq_factor %v must exceed low_freq_factor %v", s.HighFreqFactor, s.LowFreqFactor))
		}
		if s.OriginalMaxPositions <= 0 {
			errs = append(errs, fmt.Errorf("kernels: rope: llama3 original_max_position_embeddings %d must be positive", s.OriginalMaxPositions))
		}
	}
	return errors.Join(errs...)
}

// InvFreq returns the hs/2 rotation frequencies (radians per position) of
// the element pairs (i, i+hs/2), i < hs/2: Theta^(-2i/hs), then the llama3
// scaling if c has one. It panics if c is not valid (Validate).
func (c RoPEConfig) InvFreq(hs int) []float64 {
	if err := c.Validate(hs); err != nil {
		panic(err)
	}
	f := make([]float64, hs/2)
	for i := range f {
		f[i] = math.Pow(c.Theta, -float64(2*i)/float64(hs))
	}
	s := c.Scaling
	if s.IsZero() {
		return f
	}
	orig := float64(s.OriginalMaxPositions)
	for i, w := range f {
		// The number of turns a pair makes over the original context:
		// many (high frequency) keeps w, few (low) divides it by Factor,
		// and the band between blends the two linearly in that number.
		turns := orig * w / (2 * math.Pi)
		switch {
		case turns > s.HighFreqFactor:
		case turns < s.LowFreqFactor:
			f[i] = w / s.Factor
		default:
			a := (turns - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
			f[i] = a*w + (1-a)*w/s.Factor
		}
	}
	return f
}

// Table returns the cos and sin table of positions [0, T) for heads hs
// wide, the table operand of the RoPE ops: T rows of hs float32 values,
// cos(t·f_i) for i < hs/2 and then sin(t·f_i), f = c.InvFreq(hs). As in
// transformers and Meta's reference code, the angle t·f_i is formed in
// float32 (the frequency and the position rounded to float32, their
// product rounded to float32), which is what pretrained weights were
// trained with; cos and sin of that angle are exact, rounded once. It
// panics if c is not valid.
func (c RoPEConfig) Table(T, hs int) []float32 {
	if T <= 0 {
		panic(fmt.Sprintf("kernels: rope: %d positions", T))
	}
	f := c.InvFreq(hs)
	half := hs / 2
	tab := make([]float32, T*hs)
	for t := 0; t < T; t++ {
		row := tab[t*hs : t*hs+hs]
		for i, w := range f {
			a := float64(float32(t) * float32(w))
			row[i] = float32(math.Cos(a))
			row[half+i] = float32(math.Sin(a))
		}
	}
	return tab
}
