package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spill-ml/spill/offload"
)

func init() {
	register(&command{
		name:    "plan",
		summary: "choose where weights, optimizer state and activations live, and predict memory and step time",
		run:     runPlan,
	})
}

const planUsage = `Usage: spill plan [flags]

Plans an out-of-core training run without running it: where weights,
gradients, master weights, Adam state and activations live (device, host or
disk), the prefetch depth, each layer's activation policy (keep, offload,
recompute) and the micro-batch size, with the predicted peak memory of
each tier and the step time and its bottleneck.

Examples:
  spill plan --model gpt2-1.3b --batch 16 --device-memory 16GiB --host-memory 100GiB
  spill plan --layers 48 --embd 1600 --heads 25 --batch 8 --device-memory 24GiB --json
  spill plan --model gpt2-13b --device-memory 40GiB --host-memory 64GiB --disk-memory 1TiB --disk-dir /nvme/spill

The budget flags are spelled as spill train's (--device-memory, ...); the
older --device-mem, --host-mem and --disk still work. Model names are
shared with spill train: gpt2-124m is gpt2, gpt2-350m gpt2-medium, ...`

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", planUsage, stderr)
	model := fs.String("model", "", "named shape: "+fmt.Sprint(offload.ShapeNames())+" (spill train's names gpt2-124m, gpt2-350m, gpt2-774m too); --layers etc. override its dimensions")
	layers := fs.Int("layers", 0, "transformer blocks (L)")
	embd := fs.Int("embd", 0, "width (C)")
	heads := fs.Int("heads", 0, "attention heads (NH)")
	vocab := fs.Int("vocab", 0, "vocabulary size (V; default 50304)")
	seqLen := fs.Int("seq-len", 0, "tokens per sequence (T; default 1024)")
	batch := fs.Int("batch", 8, "sequences per optimizer step")
	precision := fs.String("precision", "bf16", "bf16, fp16 or fp32")
	deviceMem := fs.String("device-memory", "139GiB", "device memory budget")
	fs.StringVar(deviceMem, "device-mem", "139GiB", "alias of --device-memory")
	fs.StringVar(deviceMem, "gpu-mem-limit", "139GiB", "alias of --device-memory (as spill train's)")
	hostMem := fs.String("host-memory", "", "host memory budget (default 80% of MemAvailable)")
	fs.StringVar(hostMem, "host-mem", "", "alias of --host-memory")
	disk := fs.String("disk-memory", "", "disk tier budget (default: none, or 90% of the free space of --disk-dir)")
	fs.StringVar(disk, "disk", "", "alias of --disk-memory")
	diskDir := fs.String("disk-dir", "", "directory of the disk tier; its free space caps --disk")
	hwFile := fs.String("hardware", "", "JSON hardware profile (as written by `spill doctor`; default H200 figures)")
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("plan takes no arguments (got %q)", fs.Args())
	}

	dims := offload.GPTDims{Vocab: 50304, SeqLen: 1024}
	name := "custom"
	if *model != "" {
		d, n, ok := offload.LookupShape(*model)
		if !ok {
			return usagef("unknown --model %q (known: %v)", *model, offload.ShapeNames())
		}
		dims, name = d, n
	}
	for _, o := range []struct {
		v   int
		dst *int
	}{{*layers, &dims.Layers}, {*embd, &dims.Embd}, {*heads, &dims.Heads}, {*vocab, &dims.Vocab}, {*seqLen, &dims.SeqLen}} {
		if o.v < 0 {
			return usagef("model dimensions must be positive")
		}
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if dims.Layers == 0 || dims.Embd == 0 || dims.Heads == 0 {
		return usagef("give --model or all of --layers, --embd and --heads")
	}
	shape, err := offload.GPT(name, dims.Layers, dims.Embd, dims.Heads, dims.Vocab, dims.SeqLen)
	if err != nil {
		return usagef("%v", err)
	}
	prec, err := offload.ParsePrecision(*precision)
	if err != nil {
		return usagef("--precision: %v", err)
	}

	var b offload.Budgets
	if b.Device, err = offload.ParseBytes(*deviceMem); err != nil {
		return usagef("--device-memory: %v", err)
	}
	if *hostMem != "" {
		if b.Host, err = offload.ParseBytes(*hostMem); err != nil {
			return usagef("--host-memory: %v", err)
		}
	} else {
		lim, err := offload.ReadLimits()
		if err != nil || lim.MemAvailable <= 0 {
			return usagef("cannot read MemAvailable (%v): give --host-memory", err)
		}
		b.Host = lim.MemAvailable / 10 * 8
	}
	if *disk != "" {
		if b.Disk, err = offload.ParseBytes(*disk); err != nil {
			return usagef("--disk-memory: %v", err)
		}
	}
	if *diskDir != "" {
		free, err := offload.DiskFree(*diskDir)
		if err != nil {
			return fmt.Errorf("--disk-dir: %w", err)
		}
		if *disk == "" || b.Disk > free {
			if *disk != "" {
				fmt.Fprintf(stderr, "spill plan: --disk-memory %s exceeds the free space of %s; planning with %s\n", *disk, *diskDir, fmtGiB(free/10*9))
			}
			b.Disk = free / 10 * 9
		}
	}
	hw := offload.H200()
	if *hwFile != "" {
		data, err := os.ReadFile(*hwFile)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(data, &hw); err != nil {
			return fmt.Errorf("%s: %w", *hwFile, err)
		}
	}

	p, err := offload.Plan(offload.Request{Model: shape, Batch: *batch, Precision: prec, Budgets: b, Hardware: hw})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(p)
	}
	return p.WriteTable(stdout)
}

func fmtGiB(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }
