package engine

import (
	"fmt"
	"math"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
)

// ModelMLP is the MLP family's one preset: its shape comes from
// Config.Hidden and the dataset.
const ModelMLP = "mlp"

// mlpFamily is the multi-layer perceptron over fixed-size records.
type mlpFamily struct{}

func (mlpFamily) Name() string          { return "mlp" }
func (mlpFamily) Input() InputKind      { return InputFeatures }
func (mlpFamily) InPlaceResidual() bool { return false }

func (mlpFamily) checkBackend(kernels.Backend) error { return nil }

func (mlpFamily) describe(m *Model) string {
	s := m.MLP
	return fmt.Sprintf("%s %v, %d inputs, %d outputs", plural(len(s.Hidden), "hidden layer"), s.Hidden, s.In, s.Out)
}

func (mlpFamily) Presets() []Preset {
	return []Preset{{Name: ModelMLP, Steps: 200, LR: 1e-3}}
}

func (mlpFamily) defaults(c *Config) {
	if len(c.Hidden) == 0 {
		c.Hidden = []int{256, 256}
	}
}

func (mlpFamily) validate(c *Config, bad func(key, format string, args ...any)) {
	llamaOnly(c, bad, "an MLP")
	if c.TieEmbeddings != nil {
		bad("tie_embeddings", "only applies to transformers, not to an MLP")
	}
	for i, h := range c.Hidden {
		if h <= 0 {
			bad("hidden", "size %d (index %d) must be > 0", h, i)
		}
	}
	switch c.Task {
	case "", "classification", "regression":
	default:
		bad("task", "unknown task %q (want \"classification\" or \"regression\")", c.Task)
	}
}

func (mlpFamily) build(c *Config, s dataset.Schema, dt kernels.DType) (*Model, error) {
	out := 1
	if c.Task == TaskClassification {
		out = c.Classes
	}
	return NewMLP(MLPShape{In: s.Features, Hidden: c.Hidden, Out: out, Task: c.Task}, dt)
}

// Tasks of an MLP.
const (
	TaskClassification = "classification" // int32 label, softmax cross-entropy
	TaskRegression     = "regression"     // float32 label, mean squared error
)

// MLPShape is the shape of a multi-layer perceptron over fixed-size
// records: In features, GELU hidden layers, Out outputs (classes, or 1 for
// regression).
type MLPShape struct {
	In     int
	Hidden []int
	Out    int
	Task   string
}

// Validate reports what is wrong with the shape.
func (s MLPShape) Validate() error {
	if s.In <= 0 || s.Out <= 0 {
		return fmt.Errorf("engine: MLP shape: in %d and out %d must be positive", s.In, s.Out)
	}
	for i, h := range s.Hidden {
		if h <= 0 {
			return fmt.Errorf("engine: MLP shape: hidden layer %d has width %d", i, h)
		}
	}
	switch s.Task {
	case TaskClassification:
		if s.Out < 2 {
			return fmt.Errorf("engine: MLP classification needs at least 2 classes, got %d", s.Out)
		}
	case TaskRegression:
		if s.Out != 1 {
			return fmt.Errorf("engine: MLP regression has 1 output, got %d", s.Out)
		}
	default:
		return fmt.Errorf("engine: MLP task %q (want %q or %q)", s.Task, TaskClassification, TaskRegression)
	}
	return nil
}

// NewMLP builds an MLP of dense layers "layers.{i}" in compute dtype dt.
// Hidden layers apply GELU; the last layer computes the loss.
func NewMLP(s MLPShape, dt kernels.DType) (*Model, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	m := &Model{Family: mlpFamily{}, DType: dt, MLP: s}
	widths := append(append([]int{s.In}, s.Hidden...), s.Out)
	for i := 0; i+1 < len(widths); i++ {
		d := &dense{dt: dt, idx: i, in: widths[i], out: widths[i+1], last: i+2 == len(widths), task: s.Task}
		var b specBuilder
		d.w = b.add(fmt.Sprintf("layers.%d.weight", i), InitNormal, 1/math.Sqrt(float64(d.in)), d.out, d.in)
		d.b = b.add(fmt.Sprintf("layers.%d.bias", i), InitZeros, 0, d.out)
		d.specs, d.n = b.specs, b.n
		m.Layers = append(m.Layers, d)
	}
	return m, nil
}

// dense is out = gelu(in·Wᵀ + b) (hidden) or the loss of in·Wᵀ + b (last).
// T is always 1: B rows per micro-batch.
type dense struct {
	dt      kernels.DType
	idx     int
	in, out int
	last    bool
	task    string
	specs   []ParamSpec
	n       int
	w, b    ParamSpec
}

// acts: hidden layers save [gelu output | pre-activation]; the last layer
// saves its logits/predictions.
func (d *dense) acts(buf kernels.Buffer, B int) (out, pre kernels.Tensor, size int64) {
	a := scratchAlloc{buf: buf}
	out = a.take(d.dt, B*d.out)
	if !d.last {
		pre = a.take(d.dt, B*d.out)
	}
	return out, pre, a.off
}

func (d *dense) Name() string        { return fmt.Sprintf("layers.%d", d.idx) }
func (d *dense) Params() []ParamSpec { return d.specs }
func (d *dense) NumParams() int      { return d.n }
func (d *dense) Tied() []int         { return nil }
func (d *dense) OutputElems(B, T int) int {
	if d.last {
		return 0
	}
	return B * T * d.out
}
func (d *dense) ActivationBytes(B, T int) int64 {
	_, _, n := d.acts(nil, B*T)
	return n
}
func (d *dense) ScratchBytes(B, T int) int64 { return align(int64(B*T*d.out) * int64(d.dt.Size())) }

func (d *dense) Forward(q kernels.Queue, p *Pass, i int) {
	o, st := p.Ops, p.Table.Layers[i]
	B := p.B * p.T
	out, pre, _ := d.acts(st.Acts, B)
	if d.last {
		o.MatmulForward(q, out, p.In(i), param(st.Weights, d.w), param(st.Weights, d.b), B, d.in, d.out)
		if d.task == TaskRegression {
			o.MSEForward(q, p.Losses, out, p.Targets, B)
		} else {
			o.CrossEntropyForward(q, p.Losses, out, p.Targets, B, d.out)
		}
		return
	}
	o.MatmulForward(q, pre, p.In(i), param(st.Weights, d.w), param(st.Weights, d.b), B, d.in, d.out)
	o.GeluForward(q, out, pre, B*d.out)
}

func (d *dense) Backward(q kernels.Queue, p *Pass, i int) {
	o, st := p.Ops, p.Table.Layers[i]
	B := p.B * p.T
	out, pre, _ := d.acts(st.Acts, B)
	dpre := kernels.View(p.Scratch, 0, d.dt, B*d.out)
	o.Zero(q, dpre)
	switch {
	case !d.last:
		o.GeluBackward(q, dpre, pre, p.DOut, B*d.out)
	case d.task == TaskRegression:
		o.MSEBackward(q, dpre, out, p.Targets, B, p.LossGrad)
	default:
		o.CrossEntropyBackward(q, dpre, out, p.Targets, B, d.out, p.LossGrad)
	}
	if i > 0 {
		o.Zero(q, p.DIn)
	}
	o.MatmulBackward(q, p.DIn, param(st.Grads, d.w), param(st.Grads, d.b), dpre, p.In(i), param(st.Weights, d.w), B, d.in, d.out)
}

// The MLP has no Hugging Face architecture; its checkpoints use spill's
// names (layers.{i}.weight (out, in), layers.{i}.bias).
func (mlpFamily) hfArchitecture() (string, string)     { return "", "" }
func (mlpFamily) hfSettings(*hfConfigJSON) []hfSetting { return nil }
func (mlpFamily) hfConfig(*Model) map[string]any       { return nil }
func (mlpFamily) layouts(m *Model) []extLayout {
	return []extLayout{paramLayout(m, FormatNanoGPT, nil, nil)}
}
