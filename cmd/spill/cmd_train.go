package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spill-ml/spill/engine"
	"github.com/spill-ml/spill/kernels"
)

func init() {
	register(&command{name: "train", summary: "train a GPT or an MLP, streaming what does not fit on the device", run: runTrain})
}

const trainUsage = `Usage: spill train [--config FILE] [flags]

Trains a model on a dataset written by 'spill convert'. With no --data it
trains on a small built-in arithmetic corpus ("17+25=42"), so

  spill train

is a complete first run: a tiny GPT whose loss falls from about 5.5 to
about 2 in 200 steps (about a minute on 2 CPU cores).

Settings come from, in increasing priority: built-in defaults, the model
preset (--model), the TOML file given with --config (keys as the flag names
below with '_' for '-', e.g. seq_len = 128), and flags given on the command
line. Print the resolved settings with --print-config; that output is a
valid --config file.

Checkpoints (--checkpoint-dir) are written every --checkpoint-every steps, at
the end and on Ctrl-C (exit status 130). Continue an interrupted run with the
same settings plus --resume; only --steps may change (raise it to extend a
run: the warmup, which defaults to steps/20, keeps the checkpoint's value).
--resume skips (with a warning) a newest checkpoint that is incomplete;
--resume-from CHECKPOINT-DIR/step-N resumes from the checkpoint you pick. A
resumed run cuts the --metrics file back to the checkpoint's step and
continues it.

Examples:
  spill train --steps 100 --metrics metrics.jsonl
  spill convert --out data/corpus --seq-len 256 corpus.txt
  spill train --data data/corpus --model gpt2-124m --batch 4 --accum 8 \
      --device cuda --device-memory 8GiB --checkpoint-dir ckpt
  spill train --config run.toml --resume
  spill train --steps 20 --trace trace.json   # open trace.json in Perfetto
  spill export --from ckpt --out model.safetensors --format hf`

// configFlags binds one flag per Config field. Values land in src; after
// parsing, apply copies into a config only the flags the user set, so
// that flags override a --config file without clobbering it with defaults.
type configFlags struct {
	fs   *flag.FlagSet
	src  engine.Config
	copy map[string]func(dst *engine.Config)
}

// bind registers a flag for the field get selects, shown with default def.
func bind[T any](f *configFlags, name string, get func(*engine.Config) *T, def T, usage string,
	reg func(p *T, name string, value T, usage string)) {
	reg(get(&f.src), name, def, usage)
	f.copy[name] = func(dst *engine.Config) { *get(dst) = *get(&f.src) }
}

// bindValue registers a flag.Value for a field.
func bindValue(f *configFlags, name string, v flag.Value, set func(dst *engine.Config), usage string) {
	f.fs.Var(v, name, usage)
	f.copy[name] = set
}

// config is the run's configuration: the defaults, overridden by the
// TOML file at path (none when ""), overridden by the flags that were set.
func (cf *configFlags) config(path string) (engine.Config, error) {
	cfg := engine.DefaultConfig()
	if path != "" {
		var err error
		if cfg, err = engine.LoadConfig(path); err != nil {
			return engine.Config{}, usagef("%v", err)
		}
	}
	cf.apply(&cfg)
	return cfg, nil
}

func newConfigFlags(fs *flag.FlagSet) *configFlags {
	f := &configFlags{fs: fs, copy: map[string]func(*engine.Config){}}
	d := engine.DefaultConfig()
	str := func(name string, get func(*engine.Config) *string, def, usage string) {
		bind(f, name, get, def, usage, fs.StringVar)
	}
	num := func(name string, get func(*engine.Config) *int, def int, usage string) {
		bind(f, name, get, def, usage, fs.IntVar)
	}
	real := func(name string, get func(*engine.Config) *float64, def float64, usage string) {
		bind(f, name, get, def, usage, fs.Float64Var)
	}

	// Data.
	str("data", func(c *engine.Config) *string { return &c.Data }, "", "dataset directory written by 'spill convert' (default: the built-in arithmetic corpus)")
	str("eval-data", func(c *engine.Config) *string { return &c.EvalData }, "", "held-out dataset for evaluation (default: hold out --eval-fraction of --data)")
	real("eval-fraction", func(c *engine.Config) *float64 { return &c.EvalFraction }, d.EvalFraction, "share of --data held out for evaluation when --eval-data is not given")
	// Model.
	str("model", func(c *engine.Config) *string { return &c.Model }, d.Model, "model preset: "+strings.Join(engine.PresetNames(), ", "))
	num("layers", func(c *engine.Config) *int { return &c.Layers }, 0, "GPT blocks (default: from the preset)")
	num("heads", func(c *engine.Config) *int { return &c.Heads }, 0, "attention heads (default: from the preset)")
	num("embd", func(c *engine.Config) *int { return &c.Embd }, 0, "embedding width; must divide by --heads (default: from the preset)")
	num("vocab", func(c *engine.Config) *int { return &c.Vocab }, 0, "vocabulary size (default: the dataset's, else the preset's)")
	num("max-seq", func(c *engine.Config) *int { return &c.MaxSeq }, 0, "longest sequence the model supports (default: from the preset)")
	str("init-from", func(c *engine.Config) *string { return &c.InitFrom }, "",
		"start from pretrained weights: a safetensors `file` or a Hugging Face model directory (config.json, model.safetensors or shards); config.json sets the model and shape")
	hidden := &intListFlag{}
	bindValue(f, "hidden", hidden, func(c *engine.Config) { c.Hidden = append([]int(nil), hidden.v...) },
		"MLP hidden layer sizes, comma-separated (default 256,256)")
	str("task", func(c *engine.Config) *string { return &c.Task }, "", "MLP task: classification or regression (default: from the label type)")
	num("classes", func(c *engine.Config) *int { return &c.Classes }, 0, "MLP classes (default: largest label + 1)")
	// Batching and schedule.
	num("batch", func(c *engine.Config) *int { return &c.Batch }, d.Batch, "micro-batch size (sequences or records)")
	num("seq-len", func(c *engine.Config) *int { return &c.SeqLen }, 0, "training sequence length (default: the dataset's)")
	num("accum", func(c *engine.Config) *int { return &c.Accum }, d.Accum, "micro-batches accumulated per optimizer step")
	num("steps", func(c *engine.Config) *int { return &c.Steps }, 0, "optimizer steps (default 200 for tiny and mlp, 5000 for gpt2-*)")
	real("lr", func(c *engine.Config) *float64 { return &c.LR }, 0, "peak learning rate (default 1e-3 for tiny and mlp, 6e-4 for gpt2-*)")
	real("min-lr", func(c *engine.Config) *float64 { return &c.MinLR }, 0, "final learning rate of the cosine decay (default lr/10)")
	num("warmup", func(c *engine.Config) *int { return &c.Warmup }, 0, "linear warmup steps (default steps/20)")
	real("weight-decay", func(c *engine.Config) *float64 { return &c.WeightDecay }, d.WeightDecay, "AdamW weight decay (2-D weights only)")
	real("beta1", func(c *engine.Config) *float64 { return &c.Beta1 }, d.Beta1, "AdamW beta1")
	real("beta2", func(c *engine.Config) *float64 { return &c.Beta2 }, d.Beta2, "AdamW beta2")
	real("eps", func(c *engine.Config) *float64 { return &c.Eps }, d.Eps, "AdamW epsilon")
	real("grad-clip", func(c *engine.Config) *float64 { return &c.GradClip }, d.GradClip, "clip the global gradient norm to this (0 = off)")
	str("precision", func(c *engine.Config) *string { return &c.Precision }, d.Precision, "compute precision: bf16, fp16 or fp32 (master weights are fp32)")
	real("loss-scale", func(c *engine.Config) *float64 { return &c.LossScale }, d.LossScale, "initial fp16 loss scale")
	num("scale-window", func(c *engine.Config) *int { return &c.ScaleWindow }, d.ScaleWindow, "fp16: double the loss scale after this many good steps")
	bind(f, "seed", func(c *engine.Config) *uint64 { return &c.Seed }, d.Seed, "random seed (initialisation, shuffling)", fs.Uint64Var)
	// Evaluation and checkpoints.
	num("eval-every", func(c *engine.Config) *int { return &c.EvalEvery }, d.EvalEvery, "evaluate every N steps (0 = off)")
	num("eval-batches", func(c *engine.Config) *int { return &c.EvalBatches }, d.EvalBatches, "micro-batches per evaluation")
	str("checkpoint-dir", func(c *engine.Config) *string { return &c.CheckpointDir }, "", "write checkpoints here (default: none)")
	num("checkpoint-every", func(c *engine.Config) *int { return &c.CheckpointEvery }, d.CheckpointEvery, "checkpoint every N steps")
	num("keep-checkpoints", func(c *engine.Config) *int { return &c.KeepCheckpoints }, d.KeepCheckpoints, "keep the newest N checkpoints")
	bind(f, "resume", func(c *engine.Config) *bool { return &c.Resume }, false, "continue from the latest complete checkpoint in --checkpoint-dir (incomplete newer ones are skipped with a warning)", fs.BoolVar)
	str("resume-from", func(c *engine.Config) *string { return &c.ResumeFrom }, "", "continue from this checkpoint `directory` (CHECKPOINT-DIR/step-N); implies --resume, --checkpoint-dir defaults to its parent")
	// Device.
	str("device", func(c *engine.Config) *string { return &c.Device }, d.Device, "compute backend: auto (cuda in a -tags cuda build whose GPU opens, else cpu), cpu or cuda")
	mem := &byteSizeFlag{}
	bindValue(f, "device-memory", mem, func(c *engine.Config) { c.DeviceMemory = mem.n },
		"device memory budget, e.g. 512MiB or 8GiB (default: unlimited on cpu, the whole device on cuda)")
	bindValue(f, "gpu-mem-limit", mem, func(c *engine.Config) { c.DeviceMemory = mem.n },
		"alias of --device-memory: the device tier's hard budget (e.g. to simulate a smaller GPU)")
	num("threads", func(c *engine.Config) *int { return &c.Threads }, 0, "CPU threads for kernels (default: all)")
	// Placement (out-of-core training).
	str("offload", func(c *engine.Config) *string { return &c.Offload }, d.Offload,
		"auto: resident when the state fits --device-memory, else the planner's out-of-core plan; none: always resident")
	str("offload-weights", func(c *engine.Config) *string { return &c.OffloadWeights }, "", "pin the weights to device or host (default: the planner's choice)")
	str("offload-grads", func(c *engine.Config) *string { return &c.OffloadGrads }, "", "pin the gradients to device or host (default: the planner's choice)")
	str("offload-optimizer", func(c *engine.Config) *string { return &c.OffloadOptimizer }, "", "pin master weights and Adam state to device, host (off the device; the overflow on disk when the host budget is short) or disk (default: the planner's choice)")
	num("prefetch", func(c *engine.Config) *int { return &c.Prefetch }, 0, "layers fetched ahead of the compute when streaming (default: the planner's choice)")
	str("activations", func(c *engine.Config) *string { return &c.Activations }, "", "activation policy of every block: keep, recompute (recompute-full reruns the whole forward, recompute-selective keeps the attention's output and reruns the rest; plain recompute lets the planner choose), or offload (copied to host memory and back) (default: the planner's choice per layer)")
	bind(f, "delayed-update", func(c *engine.Config) *bool { return &c.DelayedUpdate }, false,
		"run each step's host optimizer during the next step (one step stale weights; trains out of core)", fs.BoolVar)
	hostMem := &byteSizeFlag{}
	bindValue(f, "host-memory", hostMem, func(c *engine.Config) { c.HostMemory = hostMem.n },
		"host memory budget for offloaded state, pinned when the system allows, e.g. 64GiB (default: MemAvailable less 5%, at least 2 GiB)")
	str("disk-dir", func(c *engine.Config) *string { return &c.DiskDir }, "", "directory of the disk tier for optimizer state, used when the host budget is short (default: offload/ beside --checkpoint-dir, else spill/offload in the user cache directory)")
	diskMem := &byteSizeFlag{}
	bindValue(f, "disk-memory", diskMem, func(c *engine.Config) { c.DiskMemory = diskMem.n },
		"disk tier budget, e.g. 1TiB (default: 90% of the free space of --disk-dir)")
	str("metrics", func(c *engine.Config) *string { return &c.Metrics }, "", "write one JSON line of metrics per step to this file (appended to with --resume)")
	str("trace", func(c *engine.Config) *string { return &c.Trace }, "",
		"record every device op, the optimizer and the data loader and write them to this file as Chrome trace JSON (open in Perfetto); adds a per-step time breakdown to the metrics and the summary")
	return f
}

// apply copies the flags the user set into cfg.
func (f *configFlags) apply(cfg *engine.Config) {
	f.fs.Visit(func(fl *flag.Flag) {
		if cp, ok := f.copy[fl.Name]; ok {
			cp(cfg)
		}
	})
}

type byteSizeFlag struct{ n int64 }

func (b *byteSizeFlag) String() string {
	if b == nil || b.n == 0 {
		return ""
	}
	return kernels.FormatBytes(b.n)
}

func (b *byteSizeFlag) Set(s string) error {
	n, err := kernels.ParseBytes(s)
	if err != nil {
		return err
	}
	b.n = n
	return nil
}

type intListFlag struct{ v []int }

func (l *intListFlag) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(l.v))
	for i, x := range l.v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func (l *intListFlag) Set(s string) error {
	l.v = l.v[:0]
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil {
			return fmt.Errorf("want comma-separated integers, got %q", s)
		}
		l.v = append(l.v, n)
	}
	return nil
}

// trainOptions are the flags of spill train that are not Config fields.
type trainOptions struct {
	configPath    string
	printConfig   bool
	quiet         bool
	progressEvery int
	memoryReport  bool
	planJSON      string
	cpuProfile    string
	nprocPerNode  int
}

// parseTrainArgs parses the arguments of spill train into a resolved and
// validated Config.
func parseTrainArgs(args []string, stderr io.Writer) (engine.Config, trainOptions, error) {
	var opts trainOptions
	fs := newFlagSet("train", trainUsage, stderr)
	fs.StringVar(&opts.configPath, "config", "", "TOML file with settings (flags override it)")
	fs.BoolVar(&opts.printConfig, "print-config", false, "print the resolved settings as TOML and exit")
	fs.BoolVar(&opts.quiet, "quiet", false, "no progress output (the summary is still printed)")
	fs.IntVar(&opts.progressEvery, "progress-every", 10, "when stderr is not a terminal, print a progress line every N steps")
	fs.BoolVar(&opts.memoryReport, "memory-report", false, "print the device memory summary and the plan-versus-measured table at the end")
	fs.StringVar(&opts.planJSON, "plan-json", "", "write the plan the run trains with to this file, as spill plan --json prints it")
	fs.StringVar(&opts.cpuProfile, "cpu-profile", "", "write a Go CPU profile of the whole run to this file (go tool pprof)")
	fs.IntVar(&opts.nprocPerNode, "nproc-per-node", 0, nprocUsage)
	cf := newConfigFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return engine.Config{}, opts, err
	}
	if fs.NArg() > 0 {
		return engine.Config{}, opts, usagef("train takes no arguments, got %q (flags start with --)", fs.Arg(0))
	}
	cfg, err := cf.config(opts.configPath)
	if err != nil {
		return engine.Config{}, opts, err
	}
	if err := zeroSettings(cfg); err != nil {
		return engine.Config{}, opts, err
	}
	if err := engine.ResolveResume(&cfg, func(err error) { fmt.Fprintf(stderr, "spill: warning: %v\n", err) }); err != nil {
		return engine.Config{}, opts, err
	}
	if err := engine.ResolveInitFrom(&cfg); err != nil {
		return engine.Config{}, opts, err
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return engine.Config{}, opts, usagef("invalid settings:\n  %s", strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	return cfg, opts, nil
}

// zeroSettings refuses a 0 given for a setting whose 0 EnsureDefaults
// would silently replace with the default (--batch 0 trained with 8):
// DefaultConfig sets all of them, so a 0 here came from the user.
func zeroSettings(cfg engine.Config) error {
	var bad []string
	for _, s := range []struct {
		key string
		v   int
	}{{"batch", cfg.Batch}, {"accum", cfg.Accum}, {"eval_batches", cfg.EvalBatches},
		{"checkpoint_every", cfg.CheckpointEvery}, {"keep_checkpoints", cfg.KeepCheckpoints}, {"scale_window", cfg.ScaleWindow}} {
		if s.v == 0 {
			bad = append(bad, fmt.Sprintf("%s: must be at least 1, got 0 (--%s)", s.key, strings.ReplaceAll(s.key, "_", "-")))
		}
	}
	if len(bad) > 0 {
		return usagef("invalid settings:\n  %s", strings.Join(bad, "\n  "))
	}
	return nil
}

func runTrain(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	cfg, opts, err := parseTrainArgs(args, stderr)
	if err != nil {
		return err
	}
	if opts.printConfig {
		return cfg.WriteTOML(stdout)
	}
	if opts.nprocPerNode != 0 {
		return launchTrain(ctx, opts.nprocPerNode, args, stdout, stderr)
	}
	if opts.cpuProfile != "" {
		stop, err := startCPUProfile(opts.cpuProfile)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, stop()) }()
	}

	var reporters []engine.Reporter
	var log io.Writer = stderr
	var metrics *engine.JSONLReporter
	if cfg.Metrics != "" {
		if metrics, err = openMetrics(cfg); err != nil {
			return err
		}
		reporters = append(reporters, metrics)
	}
	var bar *engine.ProgressReporter
	switch {
	case opts.quiet:
		log = io.Discard
	case isTerminal(stderr):
		bar = engine.NewProgressReporter(stderr, engine.ProgressOptions{Steps: cfg.Steps})
		log = bar.LogWriter()
		reporters = append(reporters, bar)
	default:
		reporters = append(reporters, engine.NewLineReporter(stderr, engine.ProgressOptions{Steps: cfg.Steps, Every: opts.progressEvery}))
	}

	ro := engine.RunOptions{Reporter: engine.MultiReporter(reporters...), Log: log}
	if opts.planJSON != "" {
		ro.OnPlan = func(tp *engine.TrainerPlan) error {
			if err := engine.WriteFileAtomic(opts.planJSON, func(w io.Writer) error { return writePlan(w, tp, true) }); err != nil {
				return fmt.Errorf("--plan-json %s: %w", opts.planJSON, err)
			}
			return nil
		}
	}
	sum, runErr := engine.Run(ctx, cfg, ro)
	if bar != nil {
		bar.Finish()
	}
	if metrics != nil {
		// A lost metrics line fails the run (Run stops at the first one).
		if cerr := metrics.Close(); cerr != nil && !errors.Is(runErr, cerr) {
			runErr = errors.Join(runErr, cerr)
		}
	}
	if sum != nil {
		switch {
		case runErr == nil:
			printTrainSummary(stdout, sum, "finished")
		case errors.Is(runErr, context.Canceled):
			printTrainSummary(stdout, sum, "interrupted")
		default:
			// Not a finished run: the summary goes with the error, to stderr.
			printTrainSummary(stderr, sum, "failed")
		}
		if opts.memoryReport {
			printMemoryReport(stdout, sum)
		}
	}
	return runErr
}

// openMetrics opens the --metrics file: created (or truncated) by a new run;
// a resumed run continues it, cut back to the steps the resumed checkpoint
// holds (a run killed after its last checkpoint wrote lines for steps that
// the resumed run repeats).
func openMetrics(cfg engine.Config) (*engine.JSONLReporter, error) {
	if cfg.ResumeFrom == "" {
		return engine.NewJSONLReporter(cfg.Metrics)
	}
	st, err := engine.ReadCheckpointState(cfg.ResumeFrom)
	if err != nil {
		return nil, err
	}
	if err := engine.TruncateMetrics(cfg.Metrics, st.Step); err != nil {
		return nil, err
	}
	return engine.AppendJSONLReporter(cfg.Metrics)
}

// printMemoryReport prints the device memory summary and the plan
// against the measurements.
func printMemoryReport(w io.Writer, s *engine.Summary) {
	fmt.Fprint(w, s.MemorySummary)
	if s.Plan == nil {
		return
	}
	pct := func(pred, meas float64) string {
		if pred <= 0 || meas <= 0 {
			return "-"
		}
		return fmt.Sprintf("%+.1f%%", 100*(pred-meas)/meas)
	}
	fmt.Fprintf(w, "plan versus measured %16s %16s %9s\n", "predicted", "measured", "error")
	fmt.Fprintf(w, "  %-18s %16s %16s %9s\n", "device peak", formatBytes(s.PredictedDevicePeak), formatBytes(s.MeasuredDevicePeak),
		pct(float64(s.PredictedDevicePeak), float64(s.MeasuredDevicePeak)))
	if s.PredictedHostBytes > 0 || s.HostBytes > 0 {
		fmt.Fprintf(w, "  %-18s %16s %16s %9s\n", "host (state)", formatBytes(s.PredictedHostBytes), formatBytes(s.HostBytes),
			pct(float64(s.PredictedHostBytes), float64(s.HostBytes)))
	}
	if s.HostPinning != "" {
		fmt.Fprintf(w, "  %s\n", s.HostPinning)
	}
	if s.PredictedStepTime > 0 {
		fmt.Fprintf(w, "  %-18s %15.3fs %15.3fs %9s\n", "step time", s.PredictedStepTime, s.MeanStepTime, pct(s.PredictedStepTime, s.MeanStepTime))
	}
}

// printTrainSummary prints the summary of a run that ended in state:
// finished, interrupted or failed.
func printTrainSummary(w io.Writer, s *engine.Summary, state string) {
	interrupted := state != "finished"
	fmt.Fprintf(w, "%s at step %d after %s\n", state, s.Steps, engine.FormatDuration(s.Elapsed))
	if s.FirstLoss != 0 || s.LastLoss != 0 {
		fmt.Fprintf(w, "  loss          %.4f -> %.4f (first and last step of this run)\n", s.FirstLoss, s.LastLoss)
	}
	if s.EvalLoss != nil {
		fmt.Fprintf(w, "  eval loss     %.4f\n", *s.EvalLoss)
	}
	fmt.Fprintf(w, "  throughput    %.0f tokens/s\n", s.TokensPerSec)
	fmt.Fprintf(w, "  peak device   %s\n", formatBytes(s.PeakDeviceBytes))
	if p := s.Plan; p != nil && p.Placement != nil {
		pl := p.Placement
		mode := "resident"
		if !p.Resident {
			mode = fmt.Sprintf("out of core: weights %s, grads %s, optimizer %s, recompute %d, offload %d", pl.Weights, pl.Grads,
				pl.OptimizerSplit(), pl.Recompute, pl.Offload)
			if p.Options.DelayedUpdate {
				mode += ", delayed update"
			}
		}
		fmt.Fprintf(w, "  plan          %s, micro-batch %d x %d, %s\n", mode, p.B, p.Accum, pl.Order())
		fmt.Fprintf(w, "  device peak   %s predicted, %s measured\n", formatBytes(s.PredictedDevicePeak), formatBytes(s.MeasuredDevicePeak))
		if !p.Resident {
			fmt.Fprintf(w, "  traffic       %s in, %s out per step", formatBytes(s.H2DPerStep), formatBytes(s.D2HPerStep))
			if s.DiskPerStep > 0 {
				fmt.Fprintf(w, ", %s to and from disk", formatBytes(s.DiskPerStep))
			}
			fmt.Fprintln(w)
		}
	}
	if s.PeakHostRSS > 0 {
		fmt.Fprintf(w, "  host memory   peak RSS %s", formatBytes(s.PeakHostRSS))
		if s.PredictedHostBytes > 0 {
			fmt.Fprintf(w, " (%s of state planned)", formatBytes(s.PredictedHostBytes))
		}
		fmt.Fprintln(w)
		if s.HostPinning != "" && !s.HostPinned {
			// Unpinned state halves the copies' speed: say so even in --quiet runs.
			fmt.Fprintf(w, "  warning       %s\n", s.HostPinning)
		}
	}
	if s.FirstStepAt > 0 {
		fmt.Fprintf(w, "  first step    %s after start (%s)\n", engine.FormatDuration(s.FirstStepAt), engine.FormatPhases(s.StartUp))
	}
	if s.MeanTrace != nil {
		if s.Trace != "" {
			fmt.Fprintf(w, "  trace         %s (%d steps; open in https://ui.perfetto.dev)\n", s.Trace, len(s.Breakdowns))
			fmt.Fprintf(w, "  mean per step %s\n", engine.FormatStepTrace(*s.MeanTrace))
		} else {
			fmt.Fprintf(w, "  timed steps   %d sampled (the 2nd and every 10th after; --trace times all): mean %s\n",
				len(s.Breakdowns), engine.FormatStepTrace(*s.MeanTrace))
		}
	}
	if s.Skipped > 0 {
		fmt.Fprintf(w, "  skipped steps %d (non-finite gradients)\n", s.Skipped)
	}
	if n := s.SpecKept + s.SpecDropped; n > 0 {
		fmt.Fprintf(w, "  speculative   host updates kept in %d of the %d steps that speculated (a clipped step redoes them after the norm; the step after it does not speculate)\n", s.SpecKept, n)
	}
	if s.Checkpoint != "" {
		fmt.Fprintf(w, "  checkpoint    %s\n", s.Checkpoint)
		if interrupted {
			fmt.Fprintf(w, "  continue with the same command plus --resume (or --resume-from %s)\n", s.Checkpoint)
		}
	}
}
