package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
	_ "github.com/spill-ml/spill/kernels/cpu" // the default backend
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/stream"
)

// Summary describes a finished (or interrupted) Run.
type Summary struct {
	Steps           int // optimizer steps completed, resumed ones included
	FirstLoss       float64
	LastLoss        float64
	EvalLoss        *float64 // last evaluation, nil if none ran
	TokensPerSec    float64  // targets (tokens or records) per second in this run
	PeakDeviceBytes int64
	Elapsed         time.Duration
	Checkpoint      string // last checkpoint written, "" if none
	Skipped         int    // steps skipped for non-finite gradients in this run
	// SpecKept and SpecDropped count the steps of this run whose
	// speculative host updates were kept and dropped (StepResult).
	SpecKept, SpecDropped int

	// Plan is how the run placed its state (Plan.Placement is nil when
	// no device budget was planned for).
	Plan *TrainerPlan
	// Plan versus measurement: the exact predicted device peak and the
	// measured one (the trainer's blocks at most), the host memory the
	// plan predicted for the offloaded state (staging excluded; 0 when
	// resident) and what the trainer holds, and the predicted and mean
	// measured step time.
	PredictedDevicePeak, MeasuredDevicePeak int64
	PredictedHostBytes, HostBytes           int64
	PredictedStepTime, MeanStepTime         float64
	// HostPinning says where the out-of-core trainer holds its host
	// state (pinned pool or unpinned memory) and why ("" when resident).
	HostPinning string
	// HostPinned is whether that state is in pinned memory (false when
	// resident, or when it fell back to unpinned memory: slower copies).
	HostPinned bool
	// MemorySummary is the device memory summary at the end (the offload
	// cache's table, or the backend's allocations by class).
	MemorySummary string
	// Trace is the Chrome trace JSON file written (Config.Trace; "" when
	// not tracing), Breakdowns the per-step time breakdown from the whole
	// trace and MeanTrace their mean (nil when not tracing).
	Trace      string
	Breakdowns []stream.Breakdown
	MeanTrace  *StepTrace

	// FirstStepAt is the time from the start of Run to the end of its
	// first step (start-up included); StartUp splits it into phases, in
	// order (open: the data, model and device; plan; state: the trainer's
	// device and host memory; weights: their initialisation or loading;
	// step 1).
	FirstStepAt time.Duration
	StartUp     []Phase
	// H2DPerStep, D2HPerStep and DiskPerStep are the mean bytes an
	// out-of-core trainer moved per step; PeakHostRSS the process's peak
	// resident set (0 where unknown).
	H2DPerStep, D2HPerStep, DiskPerStep int64
	PeakHostRSS                         int64

	tokens         int64 // targets trained on in this run
	stepTime       float64
	steps          int
	h2d, d2h, disk int64
}

// RunOptions are the caller's hooks into Run.
type RunOptions struct {
	Reporter Reporter  // receives every step's metrics; may be nil
	Log      io.Writer // line messages; may be nil
	// OnPlan, if set, is called with the plan the run trains with once
	// its trainer is built, before the first step; an error stops the run.
	OnPlan func(*TrainerPlan) error
}

// Run trains the model cfg describes: it opens the dataset (the embedded
// default when cfg.Data is ""), the backend and the model, resumes from the
// latest checkpoint when cfg.Resume, trains cfg.Steps optimizer steps
// reporting each to opts.Reporter, evaluates every EvalEvery steps and
// checkpoints every CheckpointEvery steps and at the end.
//
// On ctx cancellation Run stops before the next step (a step in flight is
// abandoned: its micro-batches are read again on resume), saves a
// checkpoint of the last completed step when cfg.CheckpointDir is set and
// returns an error wrapping ctx.Err() (context.Canceled for Ctrl-C).
//
// With cfg.Trace set, Run records every op of the trainer's queues, the
// optimizer, the data loader and each step, writes them to cfg.Trace as
// Chrome trace JSON when it returns (interrupted or not, once the trainer
// has been built), reports each step's breakdown in StepMetrics.Trace and
// the whole run's in Summary.Breakdowns.
func Run(ctx context.Context, cfg Config, opts RunOptions) (_ *Summary, err error) {
	began := time.Now()
	var phases []Phase
	phaseAt := began
	phase := func(name string) {
		now := time.Now()
		phases = append(phases, Phase{name, now.Sub(phaseAt)})
		phaseAt = now
	}
	logf := func(format string, args ...any) {
		if opts.Log != nil {
			fmt.Fprintf(opts.Log, format+"\n", args...)
		}
	}
	if err := ResolveResume(&cfg, func(err error) { logf("warning: %v", err) }); err != nil {
		return nil, err
	}
	if err := ResolveInitFrom(&cfg); err != nil {
		return nil, err
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	world, err := checkLaunch(cfg.Device)
	if err != nil {
		return nil, err
	}
	dataDir, err := dataDirOrDefault(ctx, cfg.Data)
	if err != nil {
		return nil, err
	}
	ds, err := dataset.Open(dataDir)
	if err != nil {
		return nil, err
	}
	defer ds.Close()
	trainSrc, evalSrc := dataset.Source(ds), dataset.Source(nil)
	if cfg.EvalData != "" {
		eds, err := dataset.Open(cfg.EvalData)
		if err != nil {
			return nil, err
		}
		defer eds.Close()
		if eds.Schema().Kind != ds.Schema().Kind || eds.SampleSize() != ds.SampleSize() {
			return nil, fmt.Errorf("engine: eval data %s (%s, %d-byte samples) does not match data %s (%s, %d-byte samples)",
				cfg.EvalData, eds.Schema().Kind, eds.SampleSize(), dataDir, ds.Schema().Kind, ds.SampleSize())
		}
		evalSrc = eds
	} else if cfg.EvalFraction > 0 {
		n := ds.Len()
		if ne := int64(math.Round(float64(n) * cfg.EvalFraction)); ne > 0 && ne < n {
			trainSrc, evalSrc = &subSource{ds, 0, n - ne}, &subSource{ds, n - ne, ne}
		}
	}
	// Pretrained weights are checked against the model before anything
	// is allocated for training (openRun).
	rs, err := openRun(&cfg, ds, dataDir, world.LocalRank, logf)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	model, pre, be := rs.model, rs.pre, rs.be
	cfg.Device = be.Name()
	// Data parallel (engine/ddp.go): every rank trains on its own share
	// of each global batch of WORLD_SIZE x Batch x Accum rows.
	comm, err := openComm(ctx, world, be)
	if err != nil {
		return nil, err
	}
	if comm != nil {
		defer comm.Close() // after the trainer's Close (deferred later)
		logf("data parallel: rank %d of %d on device %d", world.Rank, world.WorldSize, world.LocalRank)
	}
	B, T := cfg.Batch, cfg.SeqLen
	if !cfg.tokens() {
		T = 1
	}
	// With cfg.Trace every op is timed; without, a run out of core still
	// times a few sampled steps (sampledStep) for the breakdown its
	// metrics report (the exposed transfer time), at the cost of one
	// atomic load per op in the other steps. A resident run samples none.
	rec := stream.NewRecorder()
	sampled := cfg.Trace == ""
	if sampled {
		rec.SetActive(false)
	}
	phase("open")
	tr, plan, err := newRunTrainer(&cfg, be, model, B, T, rec, comm)
	if err != nil {
		return nil, err
	}
	phases = append(phases, Phase{"plan", plan.PlanTime}, Phase{"state", time.Since(phaseAt) - plan.PlanTime})
	phaseAt = time.Now()
	if sampled && plan.Resident {
		rec, sampled = nil, false
	}
	if opts.OnPlan != nil {
		if err := opts.OnPlan(plan); err != nil {
			tr.Close()
			return nil, err
		}
	}
	var sum *Summary
	if rec != nil && sampled {
		defer func() {
			if sum != nil && len(sum.Breakdowns) > 0 {
				mt := MeanStepTrace(sum.Breakdowns)
				sum.MeanTrace = &mt
			}
		}()
	} else if rec != nil {
		// Runs after tr.Close, which waits for every traced op.
		defer func() {
			spans := rec.Spans()
			if werr := writeTrace(cfg.Trace, spans); werr != nil {
				err = errors.Join(err, werr)
				return
			}
			if sum != nil {
				sum.Trace = cfg.Trace
				sum.Breakdowns = stepBreakdowns(spans, func(int) bool { return true })
				mt := MeanStepTrace(sum.Breakdowns)
				sum.MeanTrace = &mt
			}
		}()
	}
	defer tr.Close()
	if comm != nil {
		// Runs before tr.Close: a rank that fails makes the others'
		// collectives fail instead of waiting for it (and its own
		// pending ones, so that Close does not wait).
		defer func() {
			if err != nil {
				_ = comm.Abort()
			}
		}()
	}
	logf("model %s: %s, %.2fM parameters, %s on %s", cfg.Model, describeShape(model),
		float64(model.NumParams())/1e6, cfg.Precision, be.DeviceName())
	if plan.Placement != nil {
		mode := "resident"
		if !plan.Resident {
			mode = "out of core"
		}
		logf("plan (%s, device budget %s, exact device peak %s):", mode, kernels.FormatBytes(plan.Placement.Memory[0].Budget),
			kernels.FormatBytes(plan.DevicePeak))
		if opts.Log != nil {
			_ = plan.Placement.WriteTable(opts.Log)
		}
	}
	if plan.HostNote != "" {
		logf("%s", plan.HostNote)
	}
	hostPinned, hostNote := tr.HostPinning()
	if hostNote != "" {
		logf("%s", hostNote)
	}
	B = plan.B // the micro-batch the plan chose

	hash := cfg.Hash()
	cursor := dataset.Cursor{Seed: cfg.Seed}
	var tokens int64
	resumed := false
	if cfg.Resume {
		if path := cfg.ResumeFrom; path != "" { // see ResolveResume
			saved, err := ReadCheckpointState(path)
			if err != nil {
				return nil, err
			}
			if err := CheckResume(saved, &cfg); err != nil {
				return nil, fmt.Errorf("engine: checkpoint %s: %w", path, err)
			}
			// Tensor by tensor into the trainer's tiers, checksums
			// checked on the way.
			st, err := tr.RestoreCheckpoint(ctx, path)
			if err != nil {
				return nil, fmt.Errorf("engine: %w", err)
			}
			tr.Step = st.Step
			tr.Scaler.Scale, tr.Scaler.Good = st.LossScale, st.GoodSteps
			tokens, cursor, resumed = st.Tokens, st.Cursor, true
			if st.WorldSize > 0 && st.WorldSize != world.WorldSize {
				// The cursor counts each rank's samples: continue at the
				// same global position (engine/ddp_sync.go).
				if cursor, err = RemapCursor(st.Cursor, st.WorldSize, world.WorldSize); err != nil {
					return nil, fmt.Errorf("engine: checkpoint %s: %w", path, err)
				}
				logf("resuming with %d ranks a run saved with %d: the data continues at position %d of epoch %d per rank; "+
					"the global batch is now %d rows (was %d)", world.WorldSize, st.WorldSize, cursor.Position, cursor.Epoch,
					world.WorldSize*cfg.Accum*B, st.WorldSize*cfg.Accum*B)
			}
			logf("resumed from %s at step %d", path, tr.Step)
		} else {
			logf("no checkpoint in %s: starting from scratch", cfg.CheckpointDir)
		}
	}
	if !resumed && pre != nil {
		t0 := time.Now()
		if err := tr.LoadPretrained(ctx, pre); err != nil {
			return nil, err
		}
		logf("weights from %s (%s layout) in %s", pre.Where, pre.Layout(), FormatDuration(time.Since(t0)))
	} else if !resumed {
		if err := tr.InitWeights(ctx, cfg.Seed); err != nil {
			return nil, err
		}
	}

	phase("weights")

	loader, err := dataset.NewLoader(ctx, trainSrc, dataset.LoaderOptions{
		BatchSize: B, Shuffle: true, Seed: cfg.Seed, DropLast: true, Start: cursor,
		Workers: min(2, runtime.GOMAXPROCS(0)), Rank: world.Rank, WorldSize: world.WorldSize,
	})
	if err != nil {
		return nil, fmt.Errorf("engine: data %s: %w", dataDir, err)
	}
	defer loader.Close()
	dec := newDecoder(model, ds.Schema(), B, T, dataDir)
	feed := &loaderFeed{l: loader, dec: dec}
	var src BatchSource = feed
	if rec != nil {
		src = &tracedSource{src: feed, rec: rec}
	}

	sum = &Summary{Plan: plan, PredictedDevicePeak: plan.DevicePeak, HostPinning: hostNote, HostPinned: hostPinned}
	if plan.Placement != nil {
		sum.PredictedStepTime = plan.Placement.StepTime
		if !plan.Resident {
			h := plan.Placement.Memory[1]
			sum.PredictedHostBytes = h.Peak - h.Reserve - h.ByClass[offload.Workspace]
		}
	}
	saved := -1
	if resumed {
		saved = tr.Step // the checkpoint we resumed from
	}
	save := func() error {
		if cfg.CheckpointDir == "" || saved == tr.Step || world.Rank != 0 && !tr.ShardsOptimizer() {
			// Every rank holds the same state: rank 0 writes it.
			return nil
		}
		// Streamed from each tensor's tier as it is written (gathered,
		// on every rank, when the optimizer is sharded: engine/zero.go).
		w, o, err := tr.CheckpointTensors(context.Background())
		if err != nil {
			return err
		}
		if world.Rank != 0 {
			saved = tr.Step // as rank 0 does: the ranks' collectives stay matched
			return nil
		}
		ck := &Checkpoint{State: TrainState{
			Step: tr.Step, Tokens: tokens, Cursor: cursor, WorldSize: world.WorldSize, RNG: cfg.Seed,
			LossScale: tr.Scaler.Scale, GoodSteps: tr.Scaler.Good, ConfigHash: hash, Config: cfg,
		}, Weights: w, Optim: o}
		path, err := SaveCheckpoint(cfg.CheckpointDir, ck, cfg.KeepCheckpoints)
		if err != nil {
			return err
		}
		saved, sum.Checkpoint = tr.Step, path
		logf("checkpoint %s", path)
		return nil
	}
	start := time.Now()
	finish := func() *Summary {
		sum.Steps = tr.Step
		sum.Elapsed = time.Since(start)
		sum.PeakDeviceBytes = be.MemStats().Peak
		sum.MeasuredDevicePeak = measuredDevicePeak(tr, be)
		sum.HostBytes = tr.HostBytes()
		sum.MemorySummary = memorySummary(tr, be)
		if sum.steps > 0 {
			sum.MeanStepTime = sum.stepTime / float64(sum.steps)
			n := int64(sum.steps)
			sum.H2DPerStep, sum.D2HPerStep, sum.DiskPerStep = sum.h2d/n, sum.d2h/n, sum.disk/n
		}
		sum.PeakHostRSS = offload.ReadPeakRSS()
		if s := sum.Elapsed.Seconds(); s > 0 {
			sum.TokensPerSec = float64(sum.tokens) / s
		}
		return sum
	}
	interrupted := func(cause error) (*Summary, error) {
		if err := save(); err != nil {
			return finish(), errors.Join(fmt.Errorf("engine: interrupted at step %d: %w", tr.Step, cause), err)
		}
		return finish(), fmt.Errorf("engine: interrupted at step %d: %w", tr.Step, cause)
	}
	first := true
	for tr.Step < cfg.Steps {
		if err := ctx.Err(); err != nil {
			return interrupted(err)
		}
		t0 := time.Now()
		sample := sampled && sampledStep(tr.Step+1)
		if sample {
			rec.SetActive(true)
		}
		endStep := rec.BeginStep(tr.Step + 1)
		r, err := tr.TrainStep(ctx, src)
		endStep()
		if sample {
			rec.SetActive(false)
		}
		if err != nil {
			if ctx.Err() != nil {
				return interrupted(ctx.Err())
			}
			return finish(), err
		}
		dt := time.Since(t0).Seconds()
		sum.stepTime += dt
		sum.steps++
		tokens += tr.TokensPerStep()
		sum.tokens += tr.TokensPerStep()
		cursor = feed.cursor
		if first {
			phase("step 1")
			sum.FirstStepAt, sum.StartUp = time.Since(began), phases
			sum.FirstLoss, first = r.Loss, false
		}
		sum.LastLoss = r.Loss
		if r.Skipped {
			sum.Skipped++
		}
		switch r.Speculation {
		case SpecKept:
			sum.SpecKept++
		case SpecDropped:
			sum.SpecDropped++
		}
		m := StepMetrics{
			Step: tr.Step, Loss: r.Loss, LR: r.LR, GradNorm: r.GradNorm, LossScale: r.LossScale, Skipped: r.Skipped,
			PeakDeviceBytes: be.MemStats().Peak, Elapsed: time.Since(start),
			H2DBytes: r.H2DBytes, D2HBytes: r.D2HBytes, DiskBytes: r.DiskBytes, HostRSS: offload.ReadRSS(),
			Tokens: tokens, StepTime: dt, FLOPsPerToken: ModelFLOPsPerToken(model, T),
			HostBytes: tr.HostBytes(), PredictedHostBytes: sum.PredictedHostBytes,
		}
		sum.h2d += r.H2DBytes
		sum.d2h += r.D2HBytes
		sum.disk += r.DiskBytes
		if plan.Placement != nil {
			m.PredictedDevicePeak, m.MeasuredDevicePeak = plan.DevicePeak, measuredDevicePeak(tr, be)
			m.PeakError = relErr(float64(m.PredictedDevicePeak), float64(m.MeasuredDevicePeak))
			m.PredictedStepTime = plan.Placement.StepTime
			m.StepTimeError = relErr(m.PredictedStepTime, dt)
		}
		switch {
		case sample:
			if m.Trace = lastStepTrace(rec, tr.Step); m.Trace != nil {
				sum.Breakdowns = append(sum.Breakdowns, stepBreakdowns(rec.Spans(), func(s int) bool { return s == tr.Step })...)
			}
			rec.DropThrough(tr.Step)
		case rec != nil && !sampled:
			m.Trace = lastStepTrace(rec, tr.Step)
		}
		if dt > 0 {
			m.SamplesPerSec = float64(B*plan.Accum) / dt
			m.TokensPerSec = float64(tr.TokensPerStep()) / dt
		}
		if evalSrc != nil && cfg.EvalEvery > 0 && (tr.Step%cfg.EvalEvery == 0 || tr.Step == cfg.Steps) {
			// A collective under data parallelism: each rank evaluates its
			// share of the eval batches, every rank reports the mean of all.
			ev, err := tr.Evaluate(ctx, &seqFeed{src: evalSrc, dec: dec, buf: make([]byte, evalSrc.SampleSize()),
				rank: world.Rank, world: world.WorldSize}, cfg.EvalBatches)
			if err != nil {
				if ctx.Err() != nil {
					return interrupted(ctx.Err())
				}
				return finish(), err
			}
			m.EvalLoss, sum.EvalLoss = &ev, &ev
		}
		if opts.Reporter != nil {
			opts.Reporter.Report(m)
			if err := ReporterErr(opts.Reporter); err != nil {
				// Output is being lost: stop, keeping the work done.
				return finish(), errors.Join(err, save())
			}
		}
		if cfg.CheckpointEvery > 0 && tr.Step%cfg.CheckpointEvery == 0 {
			if err := save(); err != nil {
				return finish(), err
			}
		}
	}
	if err := save(); err != nil {
		return finish(), err
	}
	return finish(), nil
}

// dataDirOrDefault returns dir, or when dir is "" the directory of the
// embedded default dataset (DefaultDataset), made if need be.
func dataDirOrDefault(ctx context.Context, dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	dir, err := DefaultDataset(ctx, "")
	if err != nil {
		return "", fmt.Errorf("engine: default dataset: %w", err)
	}
	return dir, nil
}

// runSetup is what Run and Eval open before their trainer: the model, the
// pretrained weights it starts from and the device it runs on.
type runSetup struct {
	model *Model
	pre   *Pretrained // cfg.InitFrom's weights bound to model; nil without
	be    kernels.Backend
}

// openRun fills the dataset-derived fields of cfg from ds, read from dir
// (resolveData), builds the model, opens and binds cfg.InitFrom's weights
// (so that they are checked before the device is opened), opens
// cfg.Device's backend on local device index device, logging through logf
// the note OpenDevice gives, and checks that the backend runs the model.
// On error it closes what it opened; otherwise the caller closes the
// runSetup.
func openRun(cfg *Config, ds *dataset.Dataset, dir string, device int, logf func(format string, args ...any)) (*runSetup, error) {
	if err := resolveData(cfg, ds, dir); err != nil {
		return nil, err
	}
	model, err := BuildModel(cfg, ds.Schema())
	if err != nil {
		return nil, err
	}
	pre, err := openInitFrom(cfg, model)
	if err != nil {
		return nil, err
	}
	be, note, err := OpenDevice(cfg.Device, kernels.Config{MemoryLimit: cfg.DeviceMemory, Threads: cfg.Threads, Device: device})
	if err != nil {
		if pre != nil {
			pre.Close()
		}
		return nil, err
	}
	r := &runSetup{model: model, pre: pre, be: be}
	if note != "" {
		logf("%s", note)
	}
	if err := CheckBackend(be, model); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Close closes the device, then the pretrained weights.
func (r *runSetup) Close() {
	r.be.Close()
	if r.pre != nil {
		r.pre.Close()
	}
}

// openInitFrom opens cfg.InitFrom and binds it to m; nil without one.
func openInitFrom(cfg *Config, m *Model) (*Pretrained, error) {
	if cfg.InitFrom == "" {
		return nil, nil
	}
	p, err := OpenPretrained(cfg.InitFrom)
	if err != nil {
		return nil, err
	}
	if err := p.Bind(m); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// resolveData fills the dataset-derived fields of cfg (Vocab, SeqLen for a
// GPT; Task, Classes for an MLP) and checks the data fits the model.
func resolveData(cfg *Config, ds *dataset.Dataset, dir string) error {
	s := ds.Schema()
	if cfg.tokens() {
		if s.Kind != dataset.KindTokens {
			return fmt.Errorf("engine: model %s needs a tokens dataset, %s is %s (use model \"mlp\" for records)", cfg.Model, dir, s.Kind)
		}
		if cfg.Vocab == 0 {
			p, _ := LookupPreset(cfg.Model)
			switch {
			case p.Vocab != 0:
				cfg.Vocab = p.Vocab
			case s.VocabSize != 0:
				cfg.Vocab = s.VocabSize
			default:
				cfg.Vocab = TinyVocab
			}
		}
		if s.VocabSize > cfg.Vocab {
			return fmt.Errorf("engine: dataset %s has vocabulary %d%s, larger than the model's %d: train with --vocab %d (or a --model preset of that vocabulary)",
				dir, s.VocabSize, tokenizerNote(s), cfg.Vocab, s.VocabSize)
		}
		if cfg.SeqLen == 0 {
			cfg.SeqLen = min(s.SeqLen, cfg.MaxSeq)
		}
		if cfg.SeqLen > s.SeqLen {
			return fmt.Errorf("engine: seq_len %d is longer than the samples of %s (%d tokens)", cfg.SeqLen, dir, s.SeqLen)
		}
		if cfg.SeqLen > cfg.MaxSeq {
			return fmt.Errorf("engine: seq_len %d exceeds max_seq %d", cfg.SeqLen, cfg.MaxSeq)
		}
		return nil
	}
	if s.Kind != dataset.KindRecords {
		return fmt.Errorf("engine: model mlp needs a records dataset, %s is %s", dir, s.Kind)
	}
	if cfg.Task == "" {
		cfg.Task = TaskClassification
		if s.LabelDType == "float32" {
			cfg.Task = TaskRegression
		}
	}
	if cfg.Task == TaskClassification && s.LabelDType != "int32" {
		return fmt.Errorf("engine: classification needs int32 labels, %s has %s", dir, s.LabelDType)
	}
	if cfg.Task == TaskClassification && cfg.Classes == 0 {
		buf := make([]byte, ds.SampleSize())
		var hi int32 = -1
		for i := int64(0); i < ds.Len(); i++ {
			rec, err := ds.Sample(i, buf)
			if err != nil {
				return err
			}
			hi = max(hi, int32(binary.LittleEndian.Uint32(rec[len(rec)-4:])))
		}
		cfg.Classes = int(hi) + 1
	}
	return nil
}

// sampledStep says whether a run without a trace file times step n for
// its metrics: the second step (the first after start-up) and every tenth
// after it.
func sampledStep(n int) bool { return n >= 2 && (n-2)%10 == 0 }

// describeShape is the model's shape for the log, as its family says it:
// a GPT's transformer blocks ("4 blocks", the embedding and head not
// counted as layers), an MLP's hidden layers.
func describeShape(m *Model) string { return m.Family.describe(m) }

// tokenizerNote names the dataset's tokenizer, when its manifest does.
func tokenizerNote(s dataset.Schema) string {
	if s.Tokenizer == "" {
		return ""
	}
	return " (tokenizer " + s.Tokenizer + ")"
}

// BuildModel builds the model cfg describes over data of schema s, after
// the dataset-derived fields of cfg have been filled (Run does that).
func BuildModel(cfg *Config, s dataset.Schema) (*Model, error) {
	dt, err := ComputeDType(cfg.Precision)
	if err != nil {
		return nil, err
	}
	return cfg.Family().build(cfg, s, dt)
}

// subSource is the samples [off, off+n) of a source (the train and held-out
// splits of one dataset).
type subSource struct {
	src    dataset.Source
	off, n int64
}

func (s *subSource) Len() int64      { return s.n }
func (s *subSource) SampleSize() int { return s.src.SampleSize() }
func (s *subSource) Sample(i int64, dst []byte) ([]byte, error) {
	if i < 0 || i >= s.n {
		return nil, fmt.Errorf("engine: sample %d out of range [0, %d)", i, s.n)
	}
	return s.src.Sample(s.off+i, dst)
}
func (s *subSource) Advise(from, to int64) {
	if a, ok := s.src.(dataset.Advisor); ok {
		a.Advise(s.off+from, s.off+to)
	}
}

// decoder turns dataset samples into rows of a HostBatch.
type decoder struct {
	tokens   bool
	T        int
	tokSize  int
	vocab    int
	features int
	intFeat  bool
	floatLab bool
	classes  int
	dir      string
}

func newDecoder(m *Model, s dataset.Schema, B, T int, dir string) *decoder {
	d := &decoder{tokens: m.Family.Input() == InputTokens, T: T, dir: dir}
	if d.tokens {
		d.tokSize, d.vocab = s.TokenSize(), m.Vocab
	} else {
		d.features, d.intFeat, d.floatLab = s.Features, s.FeatureDType == "int32", s.LabelDType == "float32"
		if m.MLP.Task == TaskClassification {
			d.classes = m.MLP.Out
		}
	}
	return d
}

// row decodes sample idx (bytes smp) into row k of hb.
func (d *decoder) row(hb *HostBatch, k int, idx int64, smp []byte) error {
	le := binary.LittleEndian
	if d.tokens {
		in, tg := hb.Input[4*k*d.T:], hb.Targets[4*k*d.T:]
		for t := 0; t <= d.T; t++ {
			var tok uint32
			if d.tokSize == 2 {
				tok = uint32(le.Uint16(smp[2*t:]))
			} else {
				tok = le.Uint32(smp[4*t:])
			}
			if tok >= uint32(d.vocab) {
				return fmt.Errorf("engine: dataset %s: sample %d: token %d at position %d is outside the model's vocabulary (%d): train with a larger --vocab, or convert the data with --vocab (or --tokenizer) so that its manifest records its vocabulary", d.dir, idx, tok, t, d.vocab)
			}
			if t < d.T {
				le.PutUint32(in[4*t:], tok)
			}
			if t > 0 {
				le.PutUint32(tg[4*(t-1):], tok)
			}
		}
		return nil
	}
	F := d.features
	in := hb.Input[4*k*F:]
	for f := 0; f < F; f++ {
		v := le.Uint32(smp[4*f:])
		if d.intFeat {
			v = math.Float32bits(float32(int32(v)))
		}
		le.PutUint32(in[4*f:], v)
	}
	lab := le.Uint32(smp[4*F:])
	if d.classes > 0 && (int32(lab) < 0 || int(int32(lab)) >= d.classes) {
		return fmt.Errorf("engine: dataset %s: sample %d: label %d outside [0, %d)", d.dir, idx, int32(lab), d.classes)
	}
	le.PutUint32(hb.Targets[4*k:], lab)
	return nil
}

// loaderFeed feeds a Trainer from a shuffled dataset.Loader and remembers
// the cursor after the last batch it delivered.
type loaderFeed struct {
	l      *dataset.Loader
	dec    *decoder
	cursor dataset.Cursor
}

func (f *loaderFeed) Next(ctx context.Context, hb *HostBatch) error {
	b, err := f.l.Next(ctx)
	if err != nil {
		return err
	}
	defer b.Release()
	ss := len(b.Data) / b.Samples
	for k := 0; k < b.Samples; k++ {
		if err := f.dec.row(hb, k, b.Indices[k], b.Data[k*ss:(k+1)*ss]); err != nil {
			return err
		}
	}
	f.cursor = b.Cursor
	return nil
}

// seqFeed reads a source in order from its start, wrapping around (the
// fixed evaluation batches). Of a data-parallel group of world ranks
// (0 means 1), rank reads micro-batches rank, rank+world, ... of that
// sequence, so the group's first n·world micro-batches are those one rank
// reads first, shared out.
type seqFeed struct {
	src         dataset.Source
	dec         *decoder
	mb          int64 // micro-batches delivered
	buf         []byte
	rank, world int
}

func (f *seqFeed) Next(ctx context.Context, hb *HostBatch) error {
	rows := len(hb.Targets) / 4
	if f.dec.tokens {
		rows /= f.dec.T
	}
	first := (f.mb*int64(max(f.world, 1)) + int64(f.rank)) * int64(rows)
	f.mb++
	for k := 0; k < rows; k++ {
		i := (first + int64(k)) % f.src.Len()
		smp, err := f.src.Sample(i, f.buf)
		if err != nil {
			return err
		}
		if err := f.dec.row(hb, k, i, smp); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// errNoCUDA is what --device cuda says in a build without CUDA (as spill
// doctor does).
var errNoCUDA = errors.New("device cuda: this spill was built without CUDA support; rebuild with -tags cuda on a machine with the CUDA toolkit (see tools/cuda/env.sh), or use --device cpu")

// OpenDevice opens the backend named by a Config.Device value. For
// DeviceAuto it opens "cuda" when this binary has it (built with -tags
// cuda), falling back to "cpu" if the GPU does not open; note then says
// why, for the log. Other names open exactly that backend.
func OpenDevice(device string, kc kernels.Config) (be kernels.Backend, note string, err error) {
	if device != DeviceAuto {
		if device == "cuda" && !slices.Contains(kernels.Backends(), "cuda") {
			return nil, "", errNoCUDA
		}
		be, err = kernels.Open(device, kc)
		return be, "", err
	}
	if slices.Contains(kernels.Backends(), "cuda") {
		be, err = kernels.Open("cuda", kc)
		if err == nil {
			return be, "", nil
		}
		note = fmt.Sprintf("device auto: the CUDA backend did not open (%v); training on the CPU", err)
	}
	be, err = kernels.Open("cpu", kc)
	return be, note, err
}
