package engine

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/spill-ml/spill/kernels"
	"path/filepath"
)

// Config describes one training run. It is read from a TOML file
// (LoadConfig), overridden by command-line flags, completed by EnsureDefaults
// and checked by Validate, in that order:
//
//	cfg, err := LoadConfig(path) // or DefaultConfig()
//	... apply the flags the user set ...
//	cfg.EnsureDefaults()
//	err = cfg.Validate()
//
// DefaultConfig holds the defaults that do not depend on the model preset;
// EnsureDefaults fills the rest (shape, steps, learning rate, warmup, ...)
// from the preset once the model is known. The zero Config is usable too:
// EnsureDefaults fills its required fields, but fields whose zero value
// means "off" (EvalEvery, GradClip, WeightDecay, Warmup, MinLR, Seed) stay
// zero, so code that builds a Config by hand should start from
// DefaultConfig.
type Config struct {
	// Data is a dataset directory written by `spill convert`; "" trains
	// on the embedded default dataset (see DefaultDataset).
	Data string `toml:"data" json:"data"`
	// EvalData is an optional held-out dataset; "" holds out EvalFraction
	// of Data instead.
	EvalData string `toml:"eval_data" json:"eval_data"`
	// EvalFraction is the share of Data held out for evaluation when
	// EvalData is "". Default 0.05; 0 = no held-out split.
	EvalFraction float64 `toml:"eval_fraction" json:"eval_fraction"`

	// Model is a preset name (PresetNames), which picks the model family:
	// GPT ("tiny", the default, "gpt2-124m", "gpt2-350m", ...), Llama
	// ("llama-tiny", "llama3.2-1b", "llama3.1-8b", "llama2-7b", ...) or
	// "mlp".
	Model string `toml:"model" json:"model"`
	// Layers, Heads, Embd, Vocab and MaxSeq override the preset's
	// transformer shape (a Llama keeps its preset's key/value heads,
	// intermediate size and RoPE); 0 takes the preset's value (Vocab 0: the dataset schema's
	// vocabulary, else the preset's).
	Layers int `toml:"layers" json:"layers"`
	Heads  int `toml:"heads" json:"heads"`
	Embd   int `toml:"embd" json:"embd"`
	Vocab  int `toml:"vocab" json:"vocab"`
	MaxSeq int `toml:"max_seq" json:"max_seq"`
	// KVHeads, FFN, RoPETheta, RoPEScaling, NormEps and TieEmbeddings
	// override a Llama preset's num_key_value_heads, intermediate_size,
	// rope_theta, rope_scaling, rms_norm_eps and tie_word_embeddings; zero
	// (or absent) takes the preset's. InitFrom's config.json sets them.
	// Only Llama models have them, except tie_embeddings, which a GPT
	// (always tied) may state as true.
	KVHeads       int                `toml:"kv_heads,omitempty" json:"kv_heads,omitempty"`
	FFN           int                `toml:"ffn,omitempty" json:"ffn,omitempty"`
	RoPETheta     float64            `toml:"rope_theta,omitempty" json:"rope_theta,omitempty"`
	RoPEScaling   *RoPEScalingConfig `toml:"rope_scaling,omitempty" json:"rope_scaling,omitempty"`
	NormEps       float64            `toml:"norm_eps,omitempty" json:"norm_eps,omitempty"`
	TieEmbeddings *bool              `toml:"tie_embeddings,omitempty" json:"tie_embeddings,omitempty"`
	// InitFrom starts training from pretrained weights instead of a
	// random initialisation: a safetensors file or a Hugging Face model
	// directory (config.json, and model.safetensors or sharded
	// model-0000N-of-0000M.safetensors with model.safetensors.index.json).
	// The directory's config.json sets the model family and shape (see
	// ResolveInitFrom); "" = random initialisation. It conflicts with
	// Resume (a resumed run continues from its checkpoint's weights).
	InitFrom string `toml:"init_from,omitempty" json:"init_from,omitempty"`
	// Hidden lists the MLP's hidden layer sizes. Default [256, 256].
	Hidden []int `toml:"hidden" json:"hidden"`
	// Task is the MLP's task: "classification" (int32 label) or
	// "regression" (float32 label); "" = from the dataset's label dtype.
	Task string `toml:"task" json:"task"`
	// Classes is the number of classes for MLP classification; 0 = the
	// largest label in the data plus one.
	Classes int `toml:"classes" json:"classes"`

	// Batch is the micro-batch size (sequences or records). Default 8.
	Batch int `toml:"batch" json:"batch"`
	// SeqLen is the training sequence length; 0 = the dataset's seq_len.
	SeqLen int `toml:"seq_len" json:"seq_len"`
	// Accum is the number of micro-batches accumulated per optimizer
	// step. Default 1.
	Accum int `toml:"accum" json:"accum"`
	// Steps is the number of optimizer steps. Default 200 for "tiny" and
	// "mlp", 5000 for the GPT-2 presets.
	Steps int `toml:"steps" json:"steps"`
	// LR is the peak learning rate. Default 1e-3 ("tiny", "mlp"), 6e-4
	// (GPT-2 presets).
	LR float64 `toml:"lr" json:"lr"`
	// MinLR is the learning rate at the end of the cosine decay. Default
	// LR/10 (DefaultConfig sets -1, meaning "LR/10").
	MinLR float64 `toml:"min_lr" json:"min_lr"`
	// Warmup is the number of linear warmup steps. Default Steps/20
	// (DefaultConfig sets -1, meaning "Steps/20").
	Warmup int `toml:"warmup" json:"warmup"`
	// WeightDecay is AdamW's decoupled weight decay, applied to 2-D
	// weights (matmuls and embeddings) but not to norms and biases, as in
	// nanoGPT. Default 0.1.
	WeightDecay float64 `toml:"weight_decay" json:"weight_decay"`
	// Beta1, Beta2 and Eps are AdamW's. Defaults 0.9, 0.95, 1e-8.
	Beta1 float64 `toml:"beta1" json:"beta1"`
	Beta2 float64 `toml:"beta2" json:"beta2"`
	Eps   float64 `toml:"eps" json:"eps"`
	// GradClip is the global gradient-norm clip. Default 1.0; 0 = off.
	GradClip float64 `toml:"grad_clip" json:"grad_clip"`
	// Precision is the compute precision: "bf16" (default), "fp16" (with
	// dynamic loss scaling) or "fp32". Master weights are always fp32.
	Precision string `toml:"precision" json:"precision"`
	// LossScale is the initial fp16 loss scale. Default 65536.
	LossScale float64 `toml:"loss_scale" json:"loss_scale"`
	// ScaleWindow is the number of overflow-free fp16 steps after which
	// the loss scale doubles. Default 1000.
	ScaleWindow int `toml:"scale_window" json:"scale_window"`
	// Seed seeds initialisation, shuffling and dropout. Default 1337.
	Seed uint64 `toml:"seed" json:"seed"`

	// EvalEvery is the number of steps between evaluations. Default 50;
	// 0 = off.
	EvalEvery int `toml:"eval_every" json:"eval_every"`
	// EvalBatches is the number of micro-batches per evaluation.
	// Default 8.
	EvalBatches int `toml:"eval_batches" json:"eval_batches"`

	// CheckpointDir is where checkpoints go; "" = no checkpoints.
	CheckpointDir string `toml:"checkpoint_dir" json:"checkpoint_dir"`
	// CheckpointEvery is the number of steps between checkpoints.
	// Default 100. A checkpoint is also written at the end of the run and
	// on interruption.
	CheckpointEvery int `toml:"checkpoint_every" json:"checkpoint_every"`
	// KeepCheckpoints is how many of the newest checkpoints are kept.
	// Default 3.
	KeepCheckpoints int `toml:"keep_checkpoints" json:"keep_checkpoints"`
	// Resume continues from the latest complete checkpoint in
	// CheckpointDir (see ResolveResume).
	Resume bool `toml:"resume" json:"resume"`
	// ResumeFrom is a checkpoint directory (CheckpointDir/step-N) to
	// resume from; it implies Resume, and CheckpointDir defaults to its
	// parent. "" = the latest in CheckpointDir when Resume.
	ResumeFrom string `toml:"resume_from" json:"resume_from"`

	// Device is the compute backend: "auto" (default: "cuda" when the
	// binary was built with -tags cuda and the GPU opens, else "cpu"),
	// "cpu" or "cuda".
	Device string `toml:"device" json:"device"`
	// DeviceMemory is the device memory budget in bytes; 0 = unlimited on
	// the CPU backend, the whole device otherwise. In TOML it may also be
	// a string with a unit: "512MiB", "8GiB", "1.5GB".
	DeviceMemory int64 `toml:"device_memory" json:"device_memory"`
	// Threads is the number of CPU threads for kernels; 0 = GOMAXPROCS.
	Threads int `toml:"threads" json:"threads"`

	// Offload says how the training state is placed within DeviceMemory.
	// "auto" (default): resident on the device, exactly as without a
	// budget, when it fits; otherwise the planner (offload.Plan) chooses
	// where weights, gradients and optimizer state live, the prefetch
	// depth, each layer's activation policy and the largest micro-batch
	// (dividing Batch, the accumulation growing to match) that fits, and
	// the run trains out of core. "none": always resident; a budget that
	// is too small is an error naming the plan that would fit. The
	// placement options below never change the math (they are not part
	// of the resume hash), except that a smaller micro-batch changes the
	// order of floating-point sums.
	Offload string `toml:"offload" json:"offload"`
	// OffloadWeights, OffloadGrads and OffloadOptimizer pin a class's
	// home to "device", "host" or (optimizer only) "disk"; "" = the
	// planner's choice. An optimizer on the device means the resident
	// trainer; on the host, none of it on the device (the last layers'
	// on disk when the host budget is short).
	OffloadWeights   string `toml:"offload_weights" json:"offload_weights"`
	OffloadGrads     string `toml:"offload_grads" json:"offload_grads"`
	OffloadOptimizer string `toml:"offload_optimizer" json:"offload_optimizer"`
	// Prefetch is how many layer accesses ahead streamed tensors are
	// fetched; 0 = the planner's choice.
	Prefetch int `toml:"prefetch" json:"prefetch"`
	// Activations is the policy of every recomputable layer: "keep",
	// "recompute" (whole or selective, the planner's choice),
	// "recompute-full", "recompute-selective" (keep the attention's output
	// and rerun the rest) or "offload"; "" = the planner's choice per
	// layer.
	Activations string `toml:"activations" json:"activations"`
	// DelayedUpdate runs the host optimizer of step t during step t+1
	// (DeepSpeed's delayed parameter update): each step computes on the
	// weights of two steps back, one step stale, and the update is off
	// the critical path. It changes the math (it is part of the resume
	// hash) and needs the out-of-core trainer: the run is planned out of
	// core even when the state would fit the device. Default false.
	DelayedUpdate bool `toml:"delayed_update" json:"delayed_update"`
	// ZeroStage shards the optimizer state over the ranks of a
	// data-parallel run (WORLD_SIZE > 1), as DeepSpeed's
	// zero_optimization.stage: 0 (default) lets the planner decide
	// (it shards when the host is short or sharded is faster, and says
	// why; engine.ShardedOptimizerSupported); 1 or 2 always give each rank 1/WORLD_SIZE of the fp32 master weights and
	// Adam moments of the layers whose optimizer is in host RAM, with the
	// gradients reduce-scattered and the updated weights all-gathered
	// (both stages run stage 2's traffic; engine/zero.go). Layers updated
	// on the device or the disk tier are not sharded yet. Not part of the
	// resume hash: checkpoints hold whole tensors, so a run saved with N
	// ranks resumes with M, sharded or not. Conflicts with delayed_update.
	ZeroStage int `toml:"zero_stage" json:"zero_stage"`
	// HostMemory is the host memory budget for offloaded state in bytes:
	// everything the run keeps in host memory (the pinned pool of layer
	// state, the disk tier's buffers, the batches); 0 = MemAvailable less
	// HostMargin (5%, at least 2 GiB). In TOML it may be a string with a
	// unit.
	HostMemory int64 `toml:"host_memory" json:"host_memory"`
	// DiskDir is the directory of the disk tier (optimizer state on
	// disk); "" = DefaultDiskDir (beside the checkpoints, else in the
	// user's cache directory), used only when the host is short.
	DiskDir string `toml:"disk_dir" json:"disk_dir"`
	// DiskMemory is the disk tier's budget in bytes; 0 = 90% of the free
	// space of DiskDir. In TOML it may be a string with a unit.
	DiskMemory int64 `toml:"disk_memory" json:"disk_memory"`
	// Metrics is a JSONL file that receives one line per step; "" = none.
	Metrics string `toml:"metrics" json:"metrics"`
	// Trace is a file that receives, at the end of the run (and on
	// interruption), a Chrome trace JSON of every device op per queue, the
	// host optimizer and the data loader (it opens in Perfetto), and turns
	// on the per-step time breakdown in the metrics and the summary; "" =
	// no tracing (and no tracing overhead).
	Trace string `toml:"trace" json:"trace"`
}

// DefaultConfig returns the defaults that do not depend on the model
// preset. Preset-dependent fields (shape, Steps, LR, MinLR, Warmup) are left
// for EnsureDefaults.
func DefaultConfig() Config {
	return Config{
		EvalFraction:    0.05,
		Model:           "tiny",
		Batch:           8,
		Accum:           1,
		MinLR:           -1,
		Warmup:          -1,
		WeightDecay:     0.1,
		Beta1:           0.9,
		Beta2:           0.95,
		Eps:             1e-8,
		GradClip:        1.0,
		Precision:       "bf16",
		LossScale:       65536,
		ScaleWindow:     1000,
		Seed:            1337,
		EvalEvery:       50,
		EvalBatches:     8,
		CheckpointEvery: 100,
		KeepCheckpoints: 3,
		Device:          DeviceAuto,
		Offload:         OffloadAuto,
	}
}

// DeviceAuto (Config.Device) picks the CUDA backend when the binary has
// it and it opens, else the CPU backend (see OpenDevice).
const DeviceAuto = "auto"

// Offload modes (Config.Offload).
const (
	OffloadAuto = "auto"
	OffloadNone = "none"
)

// fileConfig is what LoadConfig decodes: Config with DeviceMemory
// accepting a unit string.
type fileConfig struct {
	Config
	DeviceMemory byteSizeTOML `toml:"device_memory"`
	HostMemory   byteSizeTOML `toml:"host_memory"`
	DiskMemory   byteSizeTOML `toml:"disk_memory"`
}

type byteSizeTOML struct {
	set bool
	n   int64
}

func (b *byteSizeTOML) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		b.n, b.set = x, true
		return nil
	case string:
		n, err := kernels.ParseBytes(x)
		if err != nil {
			return err
		}
		b.n, b.set = n, true
		return nil
	}
	return fmt.Errorf("memory budget: want an integer number of bytes or a string like \"512MiB\", got %T", v)
}

// LoadConfig reads a TOML config file on top of DefaultConfig. Keys the
// file does not set keep their defaults; unknown keys are an error that
// names them. It does not call EnsureDefaults or Validate.
func LoadConfig(path string) (Config, error) {
	fc := fileConfig{Config: DefaultConfig()}
	md, err := toml.DecodeFile(path, &fc)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return Config{}, fmt.Errorf("config %s: unknown key(s) %s (see `spill train --help` for the valid keys)",
			path, strings.Join(keys, ", "))
	}
	cfg := fc.Config
	for _, b := range []struct {
		src *byteSizeTOML
		dst *int64
	}{{&fc.DeviceMemory, &cfg.DeviceMemory}, {&fc.HostMemory, &cfg.HostMemory}, {&fc.DiskMemory, &cfg.DiskMemory}} {
		if b.src.set {
			*b.dst = b.src.n
		}
	}
	return cfg, nil
}

// Family is the family of the model the config names (FamilyOf).
func (c *Config) Family() Family { return FamilyOf(c.Model) }

// tokens reports whether the config's model reads token sequences.
func (c *Config) tokens() bool { return c.Family().Input() == InputTokens }

// EnsureDefaults fills zero fields with their defaults, taking the model
// shape, Steps and LR from the preset named by Model. It is idempotent.
// Vocab and SeqLen stay 0 when they come from the dataset (the trainer
// fills them once it has opened it); Task and Classes likewise.
func (c *Config) EnsureDefaults() {
	d := DefaultConfig()
	c.Model = cmp.Or(c.Model, d.Model)
	c.Batch = cmp.Or(c.Batch, d.Batch)
	c.Accum = cmp.Or(c.Accum, d.Accum)
	c.Beta1 = cmp.Or(c.Beta1, d.Beta1)
	c.Beta2 = cmp.Or(c.Beta2, d.Beta2)
	c.Eps = cmp.Or(c.Eps, d.Eps)
	c.Precision = cmp.Or(c.Precision, d.Precision)
	c.LossScale = cmp.Or(c.LossScale, d.LossScale)
	c.ScaleWindow = cmp.Or(c.ScaleWindow, d.ScaleWindow)
	c.EvalBatches = cmp.Or(c.EvalBatches, d.EvalBatches)
	c.CheckpointEvery = cmp.Or(c.CheckpointEvery, d.CheckpointEvery)
	c.KeepCheckpoints = cmp.Or(c.KeepCheckpoints, d.KeepCheckpoints)
	c.Device = cmp.Or(c.Device, d.Device)
	if c.ResumeFrom != "" {
		c.Resume = true
		if c.CheckpointDir == "" {
			c.CheckpointDir = filepath.Dir(filepath.Clean(c.ResumeFrom))
		}
	}
	c.Offload = cmp.Or(c.Offload, d.Offload)
	c.Model = CanonicalModel(c.Model)

	defSteps, defLR := 200, 1e-3
	if p, ok := LookupPreset(c.Model); ok {
		c.Layers = cmp.Or(c.Layers, p.Layers)
		c.Heads = cmp.Or(c.Heads, p.Heads)
		c.Embd = cmp.Or(c.Embd, p.Embd)
		c.MaxSeq = cmp.Or(c.MaxSeq, p.MaxSeq)
		defSteps, defLR = p.Steps, p.LR
	}
	c.Family().defaults(c)
	c.Steps = cmp.Or(c.Steps, defSteps)
	c.LR = cmp.Or(c.LR, defLR)
	if c.MinLR < 0 {
		c.MinLR = c.LR / 10
	}
	if c.Warmup < 0 {
		c.Warmup = c.Steps / 20
	}
}

// Validate reports every problem with the config at once (errors.Join),
// each naming its TOML key. Call it after EnsureDefaults.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	positive := func(key string, v int) {
		if v <= 0 {
			bad(key, "must be > 0, got %d", v)
		}
	}
	nonNeg := func(key string, v int) {
		if v < 0 {
			bad(key, "must be >= 0, got %d", v)
		}
	}
	finite := func(key string, v float64) bool {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			bad(key, "must be a finite number, got %v", v)
			return false
		}
		return true
	}

	if _, ok := LookupPreset(c.Model); !ok {
		bad("model", "unknown model %q (want one of %s)", c.Model, strings.Join(PresetNames(), ", "))
	}
	if finite("eval_fraction", c.EvalFraction) && (c.EvalFraction < 0 || c.EvalFraction >= 1) {
		bad("eval_fraction", "must be in [0, 1), got %v", c.EvalFraction)
	}
	for _, f := range []struct {
		key string
		v   int
	}{{"layers", c.Layers}, {"heads", c.Heads}, {"embd", c.Embd}, {"vocab", c.Vocab}, {"max_seq", c.MaxSeq},
		{"classes", c.Classes}, {"seq_len", c.SeqLen}, {"threads", c.Threads}, {"eval_every", c.EvalEvery}, {"warmup", c.Warmup}} {
		nonNeg(f.key, f.v)
	}
	c.Family().validate(c, bad)
	positive("batch", c.Batch)
	positive("accum", c.Accum)
	positive("steps", c.Steps)
	positive("scale_window", c.ScaleWindow)
	positive("eval_batches", c.EvalBatches)
	positive("checkpoint_every", c.CheckpointEvery)
	positive("keep_checkpoints", c.KeepCheckpoints)
	if finite("lr", c.LR) && c.LR <= 0 {
		bad("lr", "must be > 0, got %v", c.LR)
	}
	if finite("min_lr", c.MinLR) && (c.MinLR < 0 || c.MinLR > c.LR) {
		bad("min_lr", "must be in [0, lr=%v], got %v", c.LR, c.MinLR)
	}
	if c.Steps > 0 && c.Warmup > c.Steps {
		bad("warmup", "%d exceeds steps (%d)", c.Warmup, c.Steps)
	}
	if finite("weight_decay", c.WeightDecay) && c.WeightDecay < 0 {
		bad("weight_decay", "must be >= 0, got %v", c.WeightDecay)
	}
	if finite("beta1", c.Beta1) && (c.Beta1 < 0 || c.Beta1 >= 1) {
		bad("beta1", "must be in [0, 1), got %v", c.Beta1)
	}
	if finite("beta2", c.Beta2) && (c.Beta2 < 0 || c.Beta2 >= 1) {
		bad("beta2", "must be in [0, 1), got %v", c.Beta2)
	}
	if finite("eps", c.Eps) && c.Eps <= 0 {
		bad("eps", "must be > 0, got %v", c.Eps)
	}
	if finite("grad_clip", c.GradClip) && c.GradClip < 0 {
		bad("grad_clip", "must be >= 0 (0 = off), got %v", c.GradClip)
	}
	switch c.Precision {
	case "bf16", "fp16", "fp32":
	default:
		bad("precision", "unknown precision %q (want bf16, fp16 or fp32)", c.Precision)
	}
	if finite("loss_scale", c.LossScale) && c.LossScale <= 0 {
		bad("loss_scale", "must be > 0, got %v", c.LossScale)
	}
	switch c.Device {
	case DeviceAuto, "cpu", "cuda":
	default:
		bad("device", "unknown device %q (want auto, cpu or cuda)", c.Device)
	}
	if c.DeviceMemory < 0 {
		bad("device_memory", "must be >= 0, got %d", c.DeviceMemory)
	}
	c.validateOffload(bad)
	if c.Resume && c.CheckpointDir == "" {
		bad("resume", "needs checkpoint_dir")
	}
	if c.InitFrom != "" && c.Resume {
		bad("init_from", "conflicts with resume: a resumed run continues from its checkpoint's weights (resume with the run's settings and without --init-from)")
	}
	if c.EvalData != "" && c.EvalData == c.Data {
		bad("eval_data", "is the same dataset as data (%s); leave it empty to hold out eval_fraction", c.Data)
	}
	if c.Trace != "" && c.Trace == c.Metrics {
		bad("trace", "is the same file as metrics (%s)", c.Metrics)
	}
	return errors.Join(errs...)
}

// mathFields are the TOML keys of the fields that define the run's math:
// the model, the data order and the optimizer trajectory. A run resumed
// under a config that differs in any of these would not continue the
// checkpointed run. Steps is deliberately absent (a run may be extended),
// and so are paths, the device, its budget and the thread count.
var mathFields = []string{
	"eval_fraction", "model", "layers", "heads", "embd", "vocab", "max_seq", "hidden", "task", "classes",
	"batch", "seq_len", "accum", "lr", "min_lr", "warmup", "weight_decay", "beta1", "beta2", "eps",
	"grad_clip", "precision", "loss_scale", "scale_window", "seed", "delayed_update",
	"kv_heads", "ffn", "rope_theta", "rope_scaling", "norm_eps", "tie_embeddings",
}

// optionalMath are the math fields hashed only when set, so that the
// hashes of configs written before they existed stay valid.
var optionalMath = []string{"delayed_update", "kv_heads", "ffn", "rope_theta", "rope_scaling", "norm_eps", "tie_embeddings"}

// mathMap returns the math-defining fields by TOML key, as JSON values.
func (c *Config) mathMap() map[string]json.RawMessage {
	cc := *c
	if len(cc.Hidden) == 0 {
		cc.Hidden = nil // [] and absent mean the same
	}
	b, err := json.Marshal(&cc)
	if err != nil {
		panic(fmt.Sprintf("engine: marshal config: %v", err)) // only plain fields: cannot fail
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		panic(fmt.Sprintf("engine: unmarshal config: %v", err))
	}
	m := make(map[string]json.RawMessage, len(mathFields))
	for _, k := range mathFields {
		m[k] = all[k]
	}
	for _, k := range optionalMath {
		// Unset (absent: omitempty) or off: hashes from before the option
		// stay valid. (tie_embeddings false is set: absent is the preset's.)
		if v := string(m[k]); v == "" || v == "null" || (k == "delayed_update" && v == "false") {
			delete(m, k)
		}
	}
	return m
}

// Hash is the hex SHA-256 of the canonical JSON (sorted keys) of the fields
// that define the run's math (see MathDiff). Call it after EnsureDefaults
// and after the trainer has filled dataset-derived fields, so that two
// configs that train the same way hash the same.
func (c *Config) Hash() string {
	b, err := json.Marshal(c.mathMap()) // map keys are sorted
	if err != nil {
		panic(fmt.Sprintf("engine: marshal config: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// MathDiff lists the math-defining fields in which c and other differ, as
// "key: old -> new" with c's value first. Empty means they train the same
// way.
func (c *Config) MathDiff(other *Config) []string {
	a, b := c.mathMap(), other.mathMap()
	var diffs []string
	for _, k := range mathFields {
		if string(a[k]) != string(b[k]) {
			diffs = append(diffs, fmt.Sprintf("%s: %s -> %s", k, a[k], b[k]))
		}
	}
	return diffs
}

// WriteTOML writes c as TOML, in the form LoadConfig reads.
func (c *Config) WriteTOML(w io.Writer) error {
	return toml.NewEncoder(w).Encode(c)
}

// validateOffload checks the placement options.
func (c *Config) validateOffload(bad func(key, format string, args ...any)) {
	switch c.Offload {
	case OffloadAuto, OffloadNone:
	default:
		bad("offload", "unknown mode %q (want auto or none)", c.Offload)
	}
	tier := func(key, v string, tiers ...string) {
		if v == "" {
			return
		}
		for _, t := range tiers {
			if v == t {
				if c.Offload == OffloadNone && v != "device" {
					bad(key, "%s conflicts with offload = none (everything on the device)", v)
				}
				return
			}
		}
		bad(key, "unknown tier %q (want %s)", v, strings.Join(tiers, " or "))
	}
	tier("offload_weights", c.OffloadWeights, "device", "host")
	tier("offload_grads", c.OffloadGrads, "device", "host")
	tier("offload_optimizer", c.OffloadOptimizer, "device", "host", "disk")
	if c.OffloadOptimizer == "device" && (c.OffloadWeights == "host" || c.OffloadGrads == "host") {
		bad("offload_optimizer", "device (the resident trainer) needs weights and grads on the device")
	}
	if c.OffloadOptimizer == "disk" && c.DiskDir == "" {
		bad("offload_optimizer", "disk needs disk_dir")
	}
	if c.Prefetch < 0 {
		bad("prefetch", "must be >= 0 (0 = the planner's choice), got %d", c.Prefetch)
	}
	switch c.Activations {
	case "", "keep":
	case "recompute", "recompute-full", "recompute-selective", "offload":
		if c.Offload == OffloadNone {
			bad("activations", "%s conflicts with offload = none (the resident trainer keeps all activations)", c.Activations)
		}
	default:
		bad("activations", "unknown policy %q (want keep, recompute, recompute-full, recompute-selective or offload)", c.Activations)
	}
	if c.DelayedUpdate && c.Offload == OffloadNone {
		bad("delayed_update", "conflicts with offload = none (the resident trainer updates on the device, in step)")
	}
	if c.DelayedUpdate && c.OffloadOptimizer == "device" {
		bad("delayed_update", "needs the optimizer off the device (offload_optimizer host or disk)")
	}
	if c.ZeroStage < 0 || c.ZeroStage > 2 {
		bad("zero_stage", "want 0 (off), 1 or 2, got %d", c.ZeroStage)
	}
	if c.ZeroStage > 0 && c.DelayedUpdate {
		bad("zero_stage", "conflicts with delayed_update (a sharded optimizer updates in step)")
	}
	if c.HostMemory < 0 {
		bad("host_memory", "must be >= 0, got %d", c.HostMemory)
	}
	if c.DiskMemory < 0 {
		bad("disk_memory", "must be >= 0, got %d", c.DiskMemory)
	}
	if c.DiskMemory > 0 && c.DiskDir == "" {
		bad("disk_memory", "needs disk_dir")
	}
}
