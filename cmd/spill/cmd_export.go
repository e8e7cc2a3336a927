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

const exportUsage = `Usage: spill export (--checkpoint DIR | --from CKPT_ROOT) --out PATH [--format nanogpt|hf]

Writes the fp32 weights of a training checkpoint for PyTorch.
--checkpoint names one checkpoint directory (CKPT_ROOT/step-00000200);
--from takes the newest complete checkpoint under a --checkpoint-dir, or
a checkpoint directory itself.
The checkpoint's checksums are verified first; the weights are then
read and written one tensor at a time (the memory of the largest tensor).

Formats:
  nanogpt  one safetensors file (--out FILE) of nanoGPT's GPT state_dict names
           (transformer.wte.weight, ..., transformer.h.0.attn.c_attn.weight, ...,
           lm_head.weight), Linear weights as (out, in):
             model.load_state_dict(safetensors.torch.load_file("model.safetensors"))
           MLP checkpoints are written under their own names (layers.0.weight, ...).
  hf       a Hugging Face model directory (--out DIR, which must not exist or be
           empty): config.json and model.safetensors, or above --shard-size
           model-0000N-of-0000M.safetensors with model.safetensors.index.json.
           GPT models are GPT2LMHeadModel (the attention and MLP weights
           transposed to (in, out) for its Conv1D layers), Llama models
           LlamaForCausalLM; a tied LM head is left out, as save_pretrained does:
             AutoModelForCausalLM.from_pretrained(DIR)
           'spill train --init-from DIR' reads it back.

Examples:
  spill export --from ckpt --out model.safetensors
  spill export --checkpoint ckpt/step-00000200 --out gpt2-hf --format hf`

func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("export", exportUsage, stderr)
	ckpt := fs.String("checkpoint", "", "checkpoint directory (…/step-NNNNNNNN)")
	from := fs.String("from", "", "checkpoint root (export its newest complete checkpoint) or one checkpoint directory")
	out := fs.String("out", "", "output file (.safetensors) for nanogpt, directory for hf")
	format := fs.String("format", engine.FormatNanoGPT, "tensor names and layout: nanogpt or hf")
	shard := &byteSizeFlag{n: engine.DefaultShardSize}
	fs.Var(shard, "shard-size", "hf: the most bytes per safetensors file before the model is sharded (default 5GB)")
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
	// One tensor at a time: a 13B checkpoint needs no copy in memory.
	st, err := engine.ExportCheckpoint(path, *out, *format, engine.HFExportOptions{ShardSize: shard.n})
	if err != nil {
		return fmt.Errorf("export %s: %w", path, err)
	}
	size := pathSize(*out)
	fmt.Fprintf(stdout, "wrote %s (%s format, %s) from %s (step %d)\n", *out, *format, formatBytes(size), path, st.Step)
	return nil
}

// pathSize is the size of a file, or of the files of a directory.
func pathSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if !st.IsDir() {
		return st.Size()
	}
	var n int64
	ents, _ := os.ReadDir(path)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}
