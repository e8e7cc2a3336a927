package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spill-ml/spill/engine"
)

func init() {
	register(&command{name: "export", summary: "write a checkpoint's weights as a safetensors file PyTorch can load", run: runExport})
}

const exportUsage = `Usage: spill export (--checkpoint DIR | --from CKPT_ROOT) --out FILE [--format nanogpt|hf]

Writes the fp32 weights of a training checkpoint as one safetensors file.
--checkpoint names one checkpoint directory (CKPT_ROOT/step-00000200);
--from takes the newest complete checkpoint under a --checkpoint-dir, or
a checkpoint directory itself.
The checkpoint's checksums are verified first.

Formats:
  nanogpt  nanoGPT's GPT state_dict names (transformer.wte.weight, ...,
           transformer.h.0.attn.c_attn.weight, ..., lm_head.weight), Linear
           weights as (out, in):
             model.load_state_dict(safetensors.torch.load_file("model.safetensors"))
           MLP checkpoints are written under their own names (layers.0.weight, ...).
  hf       Hugging Face GPT2LMHeadModel names; the attention and MLP weights are
           transposed to (in, out) for GPT-2's Conv1D layers. The file's metadata
           holds n_layer, n_head, n_embd, vocab_size and n_positions for GPT2Config.

Examples:
  spill export --from ckpt --out model.safetensors
  spill export --checkpoint ckpt/step-00000200 --out gpt2.safetensors --format hf`

func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("export", exportUsage, stderr)
	ckpt := fs.String("checkpoint", "", "checkpoint directory (…/step-NNNNNNNN)")
	from := fs.String("from", "", "checkpoint root (export its newest complete checkpoint) or one checkpoint directory")
	out := fs.String("out", "", "output file (.safetensors)")
	format := fs.String("format", engine.FormatNanoGPT, "tensor names and layout: nanogpt or hf")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return usagef("export takes no arguments, got %q", fs.Arg(0))
	case (*ckpt == "") == (*from == ""):
		return usagef("export needs exactly one of --checkpoint DIR or --from CKPT_ROOT")
	case *out == "":
		return usagef("export needs --out FILE")
	case *format != engine.FormatNanoGPT && *format != engine.FormatHF:
		return usagef("unknown --format %q (want nanogpt or hf)", *format)
	}
	path := *ckpt
	if *from != "" && engine.IsCheckpoint(*from) {
		path = *from // a step directory, not a root
	} else if *from != "" {
		p, err := engine.LatestCheckpoint(*from)
		if err != nil {
			return err
		}
		if p == "" {
			return fmt.Errorf("no complete checkpoint in %s", *from)
		}
		path = p
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ck, err := engine.LoadCheckpoint(path)
	if err != nil {
		return err
	}
	if err := engine.Export(ck.Weights, ck.State.Config, *out, *format); err != nil {
		return fmt.Errorf("export %s: %w", path, err)
	}
	var size int64
	if st, err := os.Stat(*out); err == nil {
		size = st.Size()
	}
	fmt.Fprintf(stdout, "wrote %s (%s format, %s) from %s (step %d)\n", *out, *format, formatBytes(size), path, ck.State.Step)
	return nil
}
