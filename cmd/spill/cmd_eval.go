package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spill-ml/spill/engine"
)

func init() {
	register(&command{name: "eval", summary: "compute a model's loss on fixed batches of a dataset, without training", run: runEval})
}

const evalUsage = `Usage: spill eval [--config FILE] [flags]

Computes the mean loss of a model on fixed batches: --eval-batches
micro-batches of --batch sequences, read in order from the start of
--eval-data, else of --data (the whole dataset, no held-out split), so
that batch b, row k is sample b*batch+k. The weights come from
--init-from (a safetensors file or a Hugging Face model directory, whose
config.json sets the model), else from the random initialisation of
--seed. It takes spill train's flags; those about training are ignored.
It builds what a forward pass needs and nothing else: the weights in host
memory, streamed through the device a layer at a time with that layer's
activations; no gradients or optimizer state.
This is nanoGPT's eval_only: the loss to compare with PyTorch's on the
same tokens.

Examples:
  spill eval --init-from ./gpt2-hf --data data/owt --batch 4 --eval-batches 10
  spill eval --init-from ./llama --data tokens --batch 2 --eval-batches 1 --precision fp32 --json loss.json`

func runEval(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("eval", evalUsage, stderr)
	configPath := fs.String("config", "", "TOML file with settings (flags override it)")
	jsonOut := fs.String("json", "", "also write the result to this file as JSON")
	quiet := fs.Bool("quiet", false, "no log lines on stderr")
	cf := newConfigFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("eval takes no arguments, got %q (flags start with --)", fs.Arg(0))
	}
	cfg, err := cf.config(*configPath)
	if err != nil {
		return err
	}
	if err := zeroSettings(cfg); err != nil {
		return err
	}
	if cfg.Resume || cfg.ResumeFrom != "" {
		return usagef("eval does not resume: to evaluate a checkpoint, export it (spill export --format hf) and pass --init-from")
	}
	var log io.Writer = stderr
	if *quiet {
		log = io.Discard
	}
	res, err := engine.Eval(ctx, cfg, log)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "loss %.6f over %d batches of %d x %d tokens (%s)\n", res.Loss, res.Batches, res.Rows, res.T, res.Data)
	if *jsonOut != "" {
		js, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		if err := engine.WriteFileAtomic(*jsonOut, func(w io.Writer) error {
			_, err := w.Write(append(js, '\n'))
			return err
		}); err != nil {
			return fmt.Errorf("--json %s: %w", *jsonOut, err)
		}
	}
	return nil
}
