//go:build cuda

package cuda

import (
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"regexp"
)

// The PTX of kernels/*.cu, made by `go generate` (tools/cuda/ptx.sh).
//
//go:embed ptx/*.ptx
var ptxFS embed.FS

var entryRE = regexp.MustCompile(`(?m)^\s*\.(?:visible\s+)?\.entry\s+([A-Za-z_][A-Za-z0-9_]*)`)

// loadModules loads every embedded PTX module into the current context and
// records its entry points. Called on a context goroutine.
func (b *Backend) loadModules() error {
	files, err := fs.Glob(ptxFS, "ptx/*.ptx")
	if err != nil {
		return err
	}
	for _, f := range files {
		src, err := ptxFS.ReadFile(f)
		if err != nil {
			return err
		}
		if f == flashSM90Module {
			b.loadFlashSM90(f, string(src)) // optional, Hopper only (flash_sm90.go)
			continue
		}
		fns, err := b.loadModule(f, string(src))
		if err != nil && f == flashModule {
			// Optional: without it attention takes the cuBLAS path.
			b.flashErr = err
			continue
		}
		if err != nil {
			return err
		}
		maps.Copy(b.fns, fns)
	}
	for _, name := range kernelNames {
		if _, ok := b.fns[name]; !ok {
			return fmt.Errorf("kernel %s missing from the embedded PTX (run go generate in kernels/cuda)", name)
		}
	}
	return nil
}

// kernelNames are the entry points the ops launch.
var kernelNames = []string{
	"cast_forward", "add_forward", "scale_forward",
	"gelu_forward", "gelu_backward", "mse_forward", "mse_backward",
	"adamw_update", "sum_squares_final",
	"sum_squares_finite_partial_f32", "sum_squares_finite_partial_bf16", "sum_squares_finite_partial_f16",
	"encoder_forward", "encoder_backward", "encoder_backward_wpe",
	"layernorm_forward", "layernorm_backward", "layernorm_backward_params",
	"matmul_forward_bias", "matmul_backward_bias", "matmul_backward_bias_partial",
	"crossentropy_forward", "crossentropy_backward",
	"attention_forward", "attention_backward", "attention_backward_kv",
	"attention_forward_tiled", "attention_backward_tiled", "attention_backward_kv_tiled",
	"attn_split", "attn_merge_out", "attn_merge_grad", "attn_bwd_prep", "attn_softmax_fwd", "attn_softmax_bwd",
	"gqa_attention_forward", "gqa_attention_backward", "gqa_attention_backward_kv",
	"rmsnorm_forward", "rmsnorm_backward", "rmsnorm_dw_partial", "rmsnorm_dw_final",
	"rope_forward", "swiglu_forward", "swiglu_backward",
}

// flashModule holds the optional tensor-core attention kernels (flash.go).
const flashModule = "ptx/flashattn.ptx"

// loadModule loads one PTX module (this package's cgo, cuModuleLoadData)
// and returns its entry points.
func (b *Backend) loadModule(f, src string) (map[string]kfunc, error) {
	m, err := moduleLoad(src)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", f, err)
	}
	b.mods = append(b.mods, m)
	fns := map[string]kfunc{}
	for _, sub := range entryRE.FindAllStringSubmatch(src, -1) {
		fn, err := moduleFunction(m, sub[1])
		if err != nil {
			return nil, fmt.Errorf("%s: kernel %s: %w", f, sub[1], err)
		}
		fns[sub[1]] = fn
	}
	return fns, nil
}

func (b *Backend) fn(name string) kfunc {
	f, ok := b.fns[name]
	if !ok {
		panic("kernels/cuda: unknown kernel " + name)
	}
	return f
}
