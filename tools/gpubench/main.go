// Command gpubench measures spill's GPT training throughput on a GPU and the
// speed of its GEMMs and attention at the same shapes, and writes one JSON
// report beside PyTorch's numbers for the same work (torch_ref.py).
//
// It trains through the engine's public API (engine.Run) on synthetic
// tokens, all in device memory, in bf16 with fp32 master weights and fused
// AdamW, exactly as `spill train` would. Build it with -tags cuda (see
// tools/cuda/bench.sh, which builds, tests and runs everything in one go):
//
//	go run -tags cuda ./tools/gpubench -torch torch.json -out result.json
//
// Without the cuda tag it builds but finds no "cuda" backend.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/engine"
	"github.com/spill-ml/spill/kernels"
)

// shape is one benchmarked GPT configuration.
type shape struct {
	Name    string `json:"name"`
	Preset  string `json:"preset"`
	Layers  int    `json:"layers"`
	Embd    int    `json:"embd"`
	Heads   int    `json:"heads"`
	Vocab   int    `json:"vocab"`
	MaxSeq  int    `json:"max_seq"`
	SeqLen  int    `json:"seq_len"`
	Batch   int    `json:"batch"`
	Steps   int    `json:"steps"`
	Warmup  int    `json:"warmup_steps"`
	Params  int64  `json:"params"`
	FLOPTok int64  `json:"flops_per_token_6n"`
}

var shapes = []shape{
	{Name: "124m", Preset: "gpt2-124m", Layers: 12, Embd: 768, Heads: 12, Vocab: 50304, MaxSeq: 1024, SeqLen: 1024, Batch: 16, Steps: 30, Warmup: 5},
	{Name: "1.3b", Preset: "gpt2-1.3b", Layers: 24, Embd: 2048, Heads: 16, Vocab: 50304, MaxSeq: 2048, SeqLen: 1024, Batch: 8, Steps: 15, Warmup: 4},
	// The preset's 32 heads (of 80) made 20 of 128, the shape.
	{Name: "2.7b", Preset: "gpt2-2.7b", Layers: 32, Embd: 2560, Heads: 20, Vocab: 50304, MaxSeq: 2048, SeqLen: 2048, Batch: 4, Steps: 12, Warmup: 4},
	// A Llama preset as it stands (no overrides: Layers 0 takes the
	// preset's dimensions): grouped-query attention with head size 64,
	// RMSNorm, SwiGLU, RoPE; its model FLOPs come from the engine
	// (ModelFLOPsPerToken), and the kernel benchmarks skip it.
	{Name: "llama1b", Preset: "llama3.2-1b", Vocab: 128256, SeqLen: 2048, Batch: 4, Steps: 12, Warmup: 4},
}

// gptParams counts the parameters of the GPT-2 architecture with tied
// embeddings and biases (what engine.NewGPT builds).
func gptParams(s shape) int64 {
	L, C, V, P := int64(s.Layers), int64(s.Embd), int64(s.Vocab), int64(s.MaxSeq)
	block := 2*C + (3*C*C + 3*C) + (C*C + C) + 2*C + (4*C*C + 4*C) + (4*C*C + C)
	return V*C + P*C + L*block + 2*C
}

type trainResult struct {
	TokensPerSec float64   `json:"tokens_per_sec"`
	ModelTFLOPs  float64   `json:"model_tflops"`
	StepMsMedian float64   `json:"step_ms_median"`
	PeakBytes    int64     `json:"peak_device_bytes"`
	PeakGiB      float64   `json:"peak_device_gib"`
	Losses       []float64 `json:"losses"`
	Error        string    `json:"error,omitempty"`
	// The backend's queue goroutines per step (after warm-up), where the
	// backend reports it (cuda.HostStats): jobs (launches, memsets, copies,
	// GEMMs, ...) and kernel launches issued, milliseconds spent issuing them,
	// that time per job, and its share of the step's wall time (1 would
	// make the host the bottleneck).
	HostJobsPerStep     float64 `json:"host_jobs_per_step,omitempty"`
	HostLaunchesPerStep float64 `json:"host_launches_per_step,omitempty"`
	HostMsPerStep       float64 `json:"host_issue_ms_per_step,omitempty"`
	HostNsPerJob        float64 `json:"host_issue_ns_per_job,omitempty"`
	HostShareOfStep     float64 `json:"host_issue_share_of_step,omitempty"`
	// Milliseconds per step the goroutines waited instead (cuda.HostWait):
	// for the device, which they run a bounded number of jobs ahead of,
	// or for another queue's event. Issue plus wait is about the step's
	// time on the busiest queue; a GPU-bound step spends most of it
	// waiting.
	HostWaitMsPerStep float64 `json:"host_wait_ms_per_step,omitempty"`
}

// hostStats is cuda.HostStats in a cuda build (backend_cuda.go), else nil.
var hostStats func() (jobs, launches int64, busy time.Duration)

// hostWait is cuda.HostWait in a cuda build, else nil.
var hostWait func() time.Duration

// hostSample is hostStats at one step's report.
type hostSample struct {
	jobs, launches int64
	busy, wait     time.Duration
}

type gemmResult struct {
	Name   string  `json:"name"`
	BT     int     `json:"bt"`
	C      int     `json:"c"`
	OC     int     `json:"oc"`
	FwdMs  float64 `json:"fwd_ms"`
	BwdMs  float64 `json:"bwd_ms"`
	TFLOPs float64 `json:"tflops_fwd_bwd"`
}

type attnResult struct {
	Name   string  `json:"name"`
	B      int     `json:"b"`
	T      int     `json:"t"`
	C      int     `json:"c"`
	NH     int     `json:"nh"`
	FwdMs  float64 `json:"fwd_ms"`
	BwdMs  float64 `json:"bwd_ms"`
	TFLOPs float64 `json:"tflops_causal_3_5x_fwd"`
	// Kernels names the implementation the backend chose, when it says.
	Kernels string `json:"kernels,omitempty"`
}

type shapeReport struct {
	shape
	Spill trainResult     `json:"spill"`
	Torch json.RawMessage `json:"torch,omitempty"`
	Ratio *float64        `json:"ratio_tokens_per_sec_spill_over_torch,omitempty"`
}

type report struct {
	Date      string             `json:"date"`
	Machine   map[string]any     `json:"machine"`
	Commands  []string           `json:"commands"`
	Notes     []string           `json:"notes"`
	Shapes    []shapeReport      `json:"shapes"`
	Gemms     []gemmResult       `json:"spill_gemms"`
	Attention []attnResult       `json:"spill_attention"`
	TorchKern json.RawMessage    `json:"torch_kernels,omitempty"`
	GemmRatio map[string]float64 `json:"gemm_ratio_spill_over_torch,omitempty"`
	AttnRatio map[string]float64 `json:"attention_time_ratio_torch_over_spill,omitempty"`
}

func main() {
	torchPath := flag.String("torch", "", "JSON written by torch_ref.py to compare with")
	outPath := flag.String("out", "gpt_cuda_vs_torch.json", "report to write")
	only := flag.String("shapes", "124m,1.3b", "comma-separated shapes to run")
	device := flag.String("device", "cuda", "backend")
	kernelsOnly := flag.Bool("kernels-only", false, "skip the training runs")
	trainOnly := flag.Bool("train-only", false, "skip the kernel benchmarks (for profiling the training steps alone)")
	attnSweep := flag.String("attn-sweep", "", "only time attention forward and backward at these HS:T pairs (e.g. 64:1024,128:2048) and write them to -out")
	attnTokens := flag.Int("attn-tokens", 16384, "batch x T of each -attn-sweep shape")
	attnHeads := flag.Int("attn-heads", 16, "heads of each -attn-sweep shape")
	flag.Parse()
	skipKernels = *trainOnly
	ctx := context.Background()
	if *attnSweep != "" {
		if err := sweepAttention(ctx, *device, *attnSweep, *attnTokens, *attnHeads, *outPath); err != nil {
			fmt.Fprintln(os.Stderr, "gpubench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, *device, *torchPath, *outPath, strings.Split(*only, ","), *kernelsOnly); err != nil {
		fmt.Fprintln(os.Stderr, "gpubench:", err)
		os.Exit(1)
	}
}

// skipKernels is set by -train-only.
var skipKernels bool

func run(ctx context.Context, device, torchPath, outPath string, only []string, kernelsOnly bool) error {
	rep := report{
		Date:     time.Now().UTC().Format(time.RFC3339),
		Machine:  machine(),
		Commands: []string{strings.Join(os.Args, " ")},
		Notes: []string{
			"spill: engine.Run on the cuda backend, bf16 compute, fp32 master weights, AdamW kernel over each parameter, grad clip 1.0, synthetic uniform tokens, everything in device memory",
			"tokens_per_sec: (steps - warmup) * batch * seq_len over the wall time of those steps",
			"model_tflops: 6 * params * tokens_per_sec (params include embeddings; attention's T^2 work not counted)",
			"peak_device_bytes (spill): the backend's budget accounting (all tensors, scratch and attention workspace, not cuBLAS or the driver)",
		},
	}
	var torch map[string]json.RawMessage
	if torchPath != "" {
		if b, err := os.ReadFile(torchPath); err != nil {
			fmt.Fprintln(os.Stderr, "gpubench: no PyTorch numbers to compare with:", err)
		} else if err := json.Unmarshal(b, &torch); err != nil {
			return fmt.Errorf("%s: %w", torchPath, err)
		}
		rep.TorchKern = torch["kernels"]
		rep.Machine["torch"] = torch["machine"]
	}
	want := map[string]bool{}
	for _, s := range only {
		want[strings.TrimSpace(s)] = true
	}
	for _, s := range shapes {
		if !want[s.Name] || skipKernels || s.Layers == 0 {
			continue
		}
		g, a, err := kernelBench(device, s)
		if err != nil {
			return fmt.Errorf("%s kernels: %w", s.Name, err)
		}
		rep.Gemms = append(rep.Gemms, g...)
		rep.Attention = append(rep.Attention, a...)
	}
	if be, err := kernels.Open(device, kernels.Config{}); err == nil {
		rep.Machine["device"] = be.DeviceName()
		_ = be.Close()
	}
	rep.GemmRatio, rep.AttnRatio = kernelRatios(rep.Gemms, rep.Attention, rep.TorchKern)
	for _, s := range shapes {
		if !want[s.Name] || kernelsOnly {
			continue
		}
		if s.Layers > 0 {
			s.Params = gptParams(s)
			s.FLOPTok = 6 * s.Params
		}
		r := shapeReport{shape: s}
		fmt.Printf("== training %s (%d layers, d%d, %d heads, T%d, batch %d, %.1fM params)\n",
			s.Name, s.Layers, s.Embd, s.Heads, s.SeqLen, s.Batch, float64(s.Params)/1e6)
		res, err := train(ctx, device, s)
		if err != nil {
			res.Error = err.Error()
			fmt.Println("   error:", err)
		}
		r.Spill = res
		if t, ok := torch["shapes"]; ok {
			var ts map[string]json.RawMessage
			if json.Unmarshal(t, &ts) == nil && ts[s.Name] != nil {
				r.Torch = ts[s.Name]
				var tr struct {
					TokensPerSec float64 `json:"tokens_per_sec"`
				}
				if json.Unmarshal(ts[s.Name], &tr) == nil && tr.TokensPerSec > 0 && res.TokensPerSec > 0 {
					ratio := res.TokensPerSec / tr.TokensPerSec
					r.Ratio = &ratio
				}
			}
		}
		fmt.Printf("   spill: %.0f tok/s, %.1f TFLOP/s, step %.1f ms, peak %.2f GiB", res.TokensPerSec, res.ModelTFLOPs, res.StepMsMedian, res.PeakGiB)
		if res.HostJobsPerStep > 0 {
			fmt.Printf(", host %.2f ms/step issuing %.0f jobs (%.0f launches, %.0f ns/job), %.2f ms waiting", res.HostMsPerStep,
				res.HostJobsPerStep, res.HostLaunchesPerStep, res.HostNsPerJob, res.HostWaitMsPerStep)
		}
		if r.Ratio != nil {
			fmt.Printf(", %.3fx PyTorch", *r.Ratio)
		}
		fmt.Println()
		rep.Shapes = append(rep.Shapes, r)
	}
	b, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(outPath, append(b, '\n'), 0o644)
}

func machine() map[string]any {
	m := map[string]any{"host_nproc": runtime.NumCPU(), "go": runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					m["host_cpu_model"] = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	return m
}

// makeData writes n samples of seqLen+1 uniform random tokens below vocab.
func makeData(ctx context.Context, dir string, n, seqLen, vocab int) error {
	w, err := dataset.Create(ctx, dir, dataset.WriterOptions{
		Schema: dataset.Schema{Kind: dataset.KindTokens, TokenDType: "uint16", SeqLen: seqLen, VocabSize: vocab},
	})
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 2*(seqLen+1))
	for range n {
		for i := 0; i <= seqLen; i++ {
			binary.LittleEndian.PutUint16(buf[2*i:], uint16(rng.IntN(vocab)))
		}
		if _, err := w.Write(buf); err != nil {
			return errorsJoin(err, w.Abort())
		}
	}
	_, err = w.Commit(ctx)
	return err
}

func errorsJoin(a, b error) error {
	if b == nil {
		return a
	}
	return fmt.Errorf("%w (abort: %v)", a, b)
}

func train(ctx context.Context, device string, s shape) (trainResult, error) {
	var res trainResult
	tmp, err := os.MkdirTemp("", "gpubench-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "data")
	if err := makeData(ctx, dir, (s.Steps+2)*s.Batch, s.SeqLen, 50257); err != nil {
		return res, err
	}
	cfg := engine.DefaultConfig()
	cfg.Data = dir
	cfg.Model = s.Preset
	cfg.Layers, cfg.Heads, cfg.Embd, cfg.Vocab, cfg.MaxSeq = s.Layers, s.Heads, s.Embd, s.Vocab, s.MaxSeq
	cfg.Batch, cfg.SeqLen, cfg.Steps = s.Batch, s.SeqLen, s.Steps
	cfg.EvalEvery, cfg.EvalFraction = 0, 0
	cfg.Device, cfg.Precision = device, "bf16"
	var ms []engine.StepMetrics
	var hs []hostSample
	sum, err := engine.Run(ctx, cfg, engine.RunOptions{
		Reporter: engine.ReporterFunc(func(m engine.StepMetrics) {
			ms = append(ms, m)
			if hostStats != nil {
				var h hostSample
				h.jobs, h.launches, h.busy = hostStats()
				if hostWait != nil {
					h.wait = hostWait()
				}
				hs = append(hs, h)
			}
		}),
		Log: os.Stdout,
	})
	if err != nil {
		return res, err
	}
	if len(ms) <= s.Warmup {
		return res, fmt.Errorf("only %d steps reported", len(ms))
	}
	for _, m := range ms {
		res.Losses = append(res.Losses, m.Loss)
	}
	var steps []float64
	for i := s.Warmup; i < len(ms); i++ {
		steps = append(steps, (ms[i].Elapsed-ms[i-1].Elapsed).Seconds()*1e3)
	}
	wall := (ms[len(ms)-1].Elapsed - ms[s.Warmup-1].Elapsed).Seconds()
	res.TokensPerSec = float64((len(ms)-s.Warmup)*s.Batch*s.SeqLen) / wall
	if s.Layers > 0 {
		res.ModelTFLOPs = res.TokensPerSec * float64(6*gptParams(s)) / 1e12
	} else {
		res.ModelTFLOPs = res.TokensPerSec * ms[len(ms)-1].FLOPsPerToken / 1e12
	}
	res.StepMsMedian = median(steps)
	if len(hs) == len(ms) {
		a, z, n := hs[s.Warmup-1], hs[len(hs)-1], float64(len(ms)-s.Warmup)
		res.HostJobsPerStep = float64(z.jobs-a.jobs) / n
		res.HostLaunchesPerStep = float64(z.launches-a.launches) / n
		res.HostMsPerStep = (z.busy - a.busy).Seconds() * 1e3 / n
		if z.jobs > a.jobs {
			res.HostNsPerJob = float64((z.busy - a.busy).Nanoseconds()) / float64(z.jobs-a.jobs)
		}
		res.HostShareOfStep = res.HostMsPerStep / (wall * 1e3 / n)
		res.HostWaitMsPerStep = (z.wait - a.wait).Seconds() * 1e3 / n
	}
	res.PeakBytes = sum.PeakDeviceBytes
	res.PeakGiB = float64(sum.PeakDeviceBytes) / (1 << 30)
	return res, nil
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// kernelBench times the GEMMs of one layer and the head, and attention, at
// the shape's training sizes.
func kernelBench(device string, s shape) ([]gemmResult, []attnResult, error) {
	be, err := kernels.Open(device, kernels.Config{})
	if err != nil {
		return nil, nil, err
	}
	defer be.Close()
	q := be.DefaultQueue()
	ctx := context.Background()
	var bufs []kernels.Buffer
	defer func() {
		for _, b := range bufs {
			be.Free(b)
		}
	}()
	tensor := func(dt kernels.DType, n int) (kernels.Tensor, error) {
		b, err := be.Alloc(int64(n*dt.Size()), "bench")
		if err != nil {
			return kernels.Tensor{}, err
		}
		bufs = append(bufs, b)
		t := kernels.View(b, 0, dt, n)
		fillRandom(be, q, t)
		return t, nil
	}
	timeIt := func(reps int, f func()) (float64, error) { return timeCalls(ctx, q, reps, f) }
	BT, C := s.Batch*s.SeqLen, s.Embd
	var gs []gemmResult
	for _, g := range []struct {
		name  string
		c, oc int
	}{{"qkv", C, 3 * C}, {"proj", C, C}, {"fc", C, 4 * C}, {"fcproj", 4 * C, C}, {"lmhead", C, s.Vocab}} {
		x, err := tensor(kernels.BF16, BT*g.c)
		if err != nil {
			return nil, nil, err
		}
		w, err := tensor(kernels.BF16, g.oc*g.c)
		if err != nil {
			return nil, nil, err
		}
		y, err := tensor(kernels.BF16, BT*g.oc)
		if err != nil {
			return nil, nil, err
		}
		dx, err := tensor(kernels.BF16, BT*g.c)
		if err != nil {
			return nil, nil, err
		}
		dw, err := tensor(kernels.BF16, g.oc*g.c)
		if err != nil {
			return nil, nil, err
		}
		fwd, err := timeIt(20, func() { be.MatmulForward(q, y, x, w, kernels.Tensor{}, BT, g.c, g.oc) })
		if err != nil {
			return nil, nil, err
		}
		// As the GPT block calls it: dinp written (the Overwriter form),
		// dweight accumulated.
		bwd, err := timeIt(20, func() { kernels.MatmulBackwardSet(be, q, dx, dw, kernels.Tensor{}, y, x, w, BT, g.c, g.oc) })
		if err != nil {
			return nil, nil, err
		}
		fl := 6 * float64(BT) * float64(g.c) * float64(g.oc)
		r := gemmResult{Name: s.Name + "/" + g.name, BT: BT, C: g.c, OC: g.oc, FwdMs: fwd, BwdMs: bwd, TFLOPs: fl / ((fwd + bwd) / 1e3) / 1e12}
		fmt.Printf("   gemm %-12s BT%d C%d OC%d: fwd %.3f ms, bwd %.3f ms, %.0f TFLOP/s\n", r.Name, BT, g.c, g.oc, fwd, bwd, r.TFLOPs)
		gs = append(gs, r)
		for _, b := range bufs {
			be.Free(b)
		}
		bufs = bufs[:0]
	}
	B, T, NH := s.Batch, s.SeqLen, s.Heads
	qkv, err := tensor(kernels.BF16, B*T*3*C)
	if err != nil {
		return nil, nil, err
	}
	out, err := tensor(kernels.BF16, B*T*C)
	if err != nil {
		return nil, nil, err
	}
	lse, err := tensor(kernels.F32, B*NH*T)
	if err != nil {
		return nil, nil, err
	}
	dqkv, err := tensor(kernels.BF16, B*T*3*C)
	if err != nil {
		return nil, nil, err
	}
	dout, err := tensor(kernels.BF16, B*T*C)
	if err != nil {
		return nil, nil, err
	}
	fwd, err := timeIt(10, func() { be.AttentionForward(q, out, lse, qkv, B, T, C, NH) })
	if err != nil {
		return nil, nil, err
	}
	bwd, err := timeIt(10, func() { be.AttentionBackward(q, dqkv, dout, qkv, out, lse, B, T, C, NH) })
	if err != nil {
		return nil, nil, err
	}
	fl := 3.5 * 4 * float64(B) * float64(NH) * float64(T) * float64(T) / 2 * float64(C/NH)
	a := attnResult{Name: s.Name, B: B, T: T, C: C, NH: NH, FwdMs: fwd, BwdMs: bwd, TFLOPs: fl / ((fwd + bwd) / 1e3) / 1e12}
	if ak, ok := be.(interface {
		AttentionKernels(dt kernels.DType, T, C, NH int) string
	}); ok {
		a.Kernels = ak.AttentionKernels(kernels.BF16, T, C, NH)
	}
	fmt.Printf("   attention %s B%d T%d C%d NH%d: fwd %.3f ms, bwd %.3f ms, %.0f TFLOP/s (causal); %s\n", s.Name, B, T, C, NH, fwd, bwd, a.TFLOPs, a.Kernels)
	return gs, []attnResult{a}, nil
}

// kernelRatios compares with torch_ref.py's kernel timings (same names).
func kernelRatios(gs []gemmResult, as []attnResult, raw json.RawMessage) (map[string]float64, map[string]float64) {
	if raw == nil {
		return nil, nil
	}
	type timing struct {
		FwdMs float64 `json:"fwd_ms"`
		BwdMs float64 `json:"bwd_ms"`
	}
	var tk struct {
		Gemms     map[string]timing `json:"gemms"`
		Attention map[string]timing `json:"attention"`
	}
	if json.Unmarshal(raw, &tk) != nil {
		return nil, nil
	}
	gr, ar := map[string]float64{}, map[string]float64{}
	for _, g := range gs {
		if t, ok := tk.Gemms[g.Name]; ok && g.FwdMs+g.BwdMs > 0 {
			gr[g.Name] = (t.FwdMs + t.BwdMs) / (g.FwdMs + g.BwdMs)
		}
	}
	for _, a := range as {
		if t, ok := tk.Attention[a.Name]; ok && a.FwdMs+a.BwdMs > 0 {
			ar[a.Name] = (t.FwdMs + t.BwdMs) / (a.FwdMs + a.BwdMs)
		}
	}
	return gr, ar
}

// fillRandom fills a float tensor with pseudo-random values, uniform in
// [-1, 1), and any other with zeros: timings on constant or zero data can
// be faster than on real data.
func fillRandom(be kernels.Backend, q kernels.Queue, t kernels.Tensor) {
	if !t.DType.IsFloat() {
		be.Fill(q, t, 0)
		return
	}
	host := make([]byte, t.Bytes())
	f32 := make([]float32, t.N)
	x := uint64(0x9e3779b97f4a7c15) ^ uint64(t.N)
	for i := range f32 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		f32[i] = float32(int32(x>>32)) / (1 << 31)
	}
	switch t.DType {
	case kernels.F32:
		for i, v := range f32 {
			binary.LittleEndian.PutUint32(host[4*i:], math.Float32bits(v))
		}
	case kernels.BF16:
		for i, v := range f32 {
			binary.LittleEndian.PutUint16(host[2*i:], kernels.BF16FromF32(v))
		}
	case kernels.F16:
		for i, v := range f32 {
			binary.LittleEndian.PutUint16(host[2*i:], kernels.F16FromF32(v))
		}
	}
	be.CopyToDevice(q, t, host)
	_ = q.Synchronize(context.Background()) // before host can go
}

// sweepResult is spill's attention at one head size and length.
type sweepResult struct {
	HS      int     `json:"hs"`
	T       int     `json:"t"`
	B       int     `json:"b"`
	NH      int     `json:"nh"`
	FwdMs   float64 `json:"fwd_ms"`
	BwdMs   float64 `json:"bwd_ms"`
	TFLOPs  float64 `json:"tflops_fwd_bwd_causal"`
	Kernels string  `json:"kernels,omitempty"`
}

// sweepAttention times AttentionForward and AttentionBackwardSet (as the
// GPT block calls them) in bf16 at each HS:T of spec, with B = tokens/T
// sequences of heads heads, on random data, and writes the results to out.
func sweepAttention(ctx context.Context, device, spec string, tokens, heads int, out string) error {
	be, err := kernels.Open(device, kernels.Config{})
	if err != nil {
		return err
	}
	defer be.Close()
	q := be.DefaultQueue()
	var res []sweepResult
	for _, p := range strings.Split(spec, ",") {
		var hs, T int
		if _, err := fmt.Sscanf(strings.TrimSpace(p), "%d:%d", &hs, &T); err != nil {
			return fmt.Errorf("-attn-sweep %q: %w", p, err)
		}
		B, NH := max(1, tokens/T), heads
		C := hs * NH
		var bufs []kernels.Buffer
		tensor := func(dt kernels.DType, n int) kernels.Tensor {
			b, e := be.Alloc(int64(n*dt.Size()), "bench")
			if e != nil && err == nil {
				err = e
			}
			if e != nil {
				return kernels.Tensor{}
			}
			bufs = append(bufs, b)
			t := kernels.View(b, 0, dt, n)
			fillRandom(be, q, t)
			return t
		}
		qkv, o, lse := tensor(kernels.BF16, B*T*3*C), tensor(kernels.BF16, B*T*C), tensor(kernels.F32, B*NH*T)
		dqkv, dout := tensor(kernels.BF16, B*T*3*C), tensor(kernels.BF16, B*T*C)
		if err != nil {
			return err
		}
		fwd, err := timeCalls(ctx, q, 10, func() { be.AttentionForward(q, o, lse, qkv, B, T, C, NH) })
		if err != nil {
			return err
		}
		bwd, err := timeCalls(ctx, q, 10, func() { kernels.AttentionBackwardSet(be, q, dqkv, dout, qkv, o, lse, B, T, C, NH) })
		if err != nil {
			return err
		}
		fl := 3.5 * 4 * float64(B) * float64(NH) * float64(T) * float64(T) / 2 * float64(hs)
		r := sweepResult{HS: hs, T: T, B: B, NH: NH, FwdMs: fwd, BwdMs: bwd, TFLOPs: fl / ((fwd + bwd) / 1e3) / 1e12}
		if ak, ok := be.(interface {
			AttentionKernels(dt kernels.DType, T, C, NH int) string
		}); ok {
			r.Kernels = ak.AttentionKernels(kernels.BF16, T, C, NH)
		}
		fmt.Printf("   spill attention hs%d T%d B%d NH%d: fwd %.3f ms, bwd %.3f ms, %.0f TFLOP/s (causal)\n", hs, T, B, NH, fwd, bwd, r.TFLOPs)
		res = append(res, r)
		for _, b := range bufs {
			be.Free(b)
		}
	}
	b, err := json.MarshalIndent(map[string]any{"date": time.Now().UTC().Format(time.RFC3339), "machine": machine(),
		"command": strings.Join(os.Args, " "), "attention": res}, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(b, '\n'), 0o644)
}

// timeCalls runs f reps times after warm-up and returns ms per call,
// repeating until the timed run lasts at least 50 ms.
func timeCalls(ctx context.Context, q kernels.Queue, reps int, f func()) (float64, error) {
	for range 3 {
		f()
	}
	if err := q.Synchronize(ctx); err != nil {
		return 0, err
	}
	var ms float64
	for pass := 0; pass < 2; pass++ {
		t0 := time.Now()
		for range reps {
			f()
		}
		if err := q.Synchronize(ctx); err != nil {
			return 0, err
		}
		total := time.Since(t0).Seconds() * 1e3
		ms = total / float64(reps)
		if total >= 50 {
			break
		}
		reps = int(min(2000, 50/ms+1))
	}
	return ms, nil
}
