package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spill-ml/spill/engine"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/plan"
)

func init() {
	register(&command{
		name:    "plan",
		summary: "show where weights, optimizer state and activations would live, and the predicted memory and step time",
		run:     runPlan,
	})
}

const planUsage = `Usage: spill plan [--config FILE] [train flags] [--json] [--hardware FILE]

Plans a training run without running it, with the planner and the flags of
spill train: the same flags give the plan spill train runs. It prints where
weights, gradients, master weights, Adam state and activations live
(device, host or disk), the micro-batch and the order of the step
(micro-batch-major, layer-major or groups between), the prefetch depth and
each layer's activation policy (keep, offload, recompute), the exact peak
memory of each tier, the predicted step time and its bottleneck, and the
best plan of every other family with why it lost.

--batch is the micro-batch and --accum the micro-batches per optimizer
step, as in spill train; the planner may split a micro-batch further
(the step's sequences stay batch x accum). Without --data a full-size
preset is planned for token sequences of --seq-len (default: the model's
context). The device is --device (cuda unless cpu is named) with its whole
memory (139 GiB, an H200) unless --device-memory says otherwise; the host
budget defaults to MemAvailable less a margin, the disk tier to 90% of the
free space of --disk-dir (default: beside --checkpoint-dir, else the user
cache directory).

--nproc-per-node N plans one rank of a data-parallel job of N processes
on this node (--nnodes M of them: N x M ranks), as spill train
--nproc-per-node runs it: the batch, the device budget and the plan are
each rank's; the host and disk budgets are the node's, each rank planning
for 1/N of them. It prints the per-rank budgets and peaks, the gradients'
all-reduce time (at the profile's interconnect_bytes_per_s, default an
assumed 360 GB/s of NVLink) and whether the optimizer state is sharded
across the ranks (--shard-optimizer auto, on or off; default: as spill
train, which does not shard it yet).

Examples:
  spill plan --model gpt2-1.3b --seq-len 1024 --batch 8 --accum 8 --device-memory 8GiB
  spill plan --model gpt2-13b --batch 8 --accum 8 --device-memory 40GiB --host-memory 64GiB --disk-dir /nvme/spill
  spill plan --layers 48 --embd 1600 --heads 25 --batch 8 --device-memory 24GiB --json
  spill plan --model llama2-13b --batch 4 --accum 4 --nproc-per-node 8 --host-memory 1TiB --device-memory 40GiB --shard-optimizer auto`

// planDeviceMemory is the memory of the device spill plan assumes when
// --device-memory is not given: an H200's usable HBM.
const planDeviceMemory = 139 << 30

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", planUsage, stderr)
	configPath := fs.String("config", "", "TOML file with settings (flags override it)")
	hwFile := fs.String("hardware", "", "JSON hardware profile (as written by `spill doctor`; default H200 figures)")
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	nproc := fs.Int("nproc-per-node", 0, "plan one rank of `N` data-parallel processes on this node (host and disk budgets shared by them)")
	nnodes := fs.Int("nnodes", 1, "nodes of --nproc-per-node ranks each")
	shard := fs.String("shard-optimizer", "", "shard the optimizer state across ranks: auto, on or off (default: as spill train)")
	cf := newConfigFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("plan takes no arguments (got %q)", fs.Args())
	}
	cfg, err := cf.config(*configPath)
	if err != nil {
		return err
	}
	if err := engine.ResolveInitFrom(&cfg); err != nil {
		return err
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return usagef("invalid settings:\n  %s", strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	var hw *offload.Hardware
	if *hwFile != "" {
		data, err := os.ReadFile(*hwFile)
		if err != nil {
			return err
		}
		h := offload.H200()
		if err := json.Unmarshal(data, &h); err != nil {
			return fmt.Errorf("%s: %w", *hwFile, err)
		}
		hw = &h
	}
	device, limit := "cuda", int64(planDeviceMemory)
	if cfg.Device == "cpu" {
		device, limit = "cpu", 0
	}
	world, err := planWorld(*nproc, *nnodes, *shard)
	if err != nil {
		return err
	}
	tp, _, err := engine.PlanConfigWorld(ctx, cfg, device, limit, hw, world)
	if err != nil {
		return err
	}
	return writePlan(stdout, tp, *asJSON)
}

// planWorld is the job --nproc-per-node, --nnodes and --shard-optimizer
// describe.
func planWorld(nproc, nnodes int, shard string) (engine.PlanWorld, error) {
	if nproc < 0 || nnodes < 1 {
		return engine.PlanWorld{}, usagef("--nproc-per-node %d, --nnodes %d: want at least 1", nproc, nnodes)
	}
	w := engine.PlanWorld{Ranks: max(nproc, 1) * nnodes, LocalRanks: max(nproc, 1), Shard: plan.ShardOff}
	if engine.ShardedOptimizerSupported {
		w.Shard = plan.ShardAuto
	}
	if shard != "" {
		s, err := plan.ParseSharding(shard)
		if err != nil {
			return w, usagef("--shard-optimizer: %v", err)
		}
		w.Shard = s
	}
	if w.Ranks <= 1 {
		return engine.PlanWorld{}, nil
	}
	return w, nil
}

// writePlan prints a run's plan as spill plan does: as a table, or as the
// placement's JSON.
func writePlan(w io.Writer, tp *engine.TrainerPlan, asJSON bool) error {
	if tp.Placement == nil {
		if asJSON {
			return json.NewEncoder(w).Encode(map[string]any{"resident": true, "micro_batch": tp.B, "accum": tp.Accum,
				"device_peak": tp.DevicePeak})
		}
		_, err := fmt.Fprintf(w, "resident: everything on the device (no device budget), micro-batch %d x %d, device peak %s\n",
			tp.B, tp.Accum, formatBytes(tp.DevicePeak))
		return err
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(tp.Placement)
	}
	return tp.Placement.WriteTable(w)
}
