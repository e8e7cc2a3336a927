package engine

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// StepMetrics is what the training loop reports after each optimizer step.
type StepMetrics struct {
	Step            int           `json:"step"` // 1-based index of the step just taken
	Loss            float64       `json:"loss"` // mean training loss over the step's micro-batches
	LR              float64       `json:"lr"`
	GradNorm        float64       `json:"grad_norm"` // global norm before clipping
	LossScale       float64       `json:"loss_scale"`
	Skipped         bool          `json:"skipped"` // fp16 overflow: the update was skipped
	TokensPerSec    float64       `json:"tokens_per_sec"`
	SamplesPerSec   float64       `json:"samples_per_sec"`
	PeakDeviceBytes int64         `json:"peak_device_bytes"`
	Elapsed         time.Duration `json:"elapsed_ns"` // since the start of this process's run
	EvalLoss        *float64      `json:"eval_loss,omitempty"`
	// For run reports (0 when unknown): the targets trained on so far
	// (resumed steps included), this step's wall time, the model's
	// training FLOPs per target (ModelFLOPsPerToken), and the host memory
	// of the trainer's offloaded state with the plan's prediction of it.
	Tokens             int64   `json:"tokens"`
	StepTime           float64 `json:"step_time_s"`
	FLOPsPerToken      float64 `json:"model_flops_per_token,omitempty"`
	HostBytes          int64   `json:"host_bytes,omitempty"`
	PredictedHostBytes int64   `json:"predicted_host_bytes,omitempty"`
	// Plan versus measurement, when the run was planned for a device
	// budget (0 otherwise): the predicted and measured device peak (bytes
	// the trainer's blocks held at most), the predicted step time and the
	// relative errors (predicted - measured) / measured.
	PredictedDevicePeak int64   `json:"predicted_device_peak,omitempty"`
	MeasuredDevicePeak  int64   `json:"measured_device_peak,omitempty"`
	PeakError           float64 `json:"peak_error,omitempty"`
	PredictedStepTime   float64 `json:"predicted_step_time_s,omitempty"`
	StepTimeError       float64 `json:"step_time_error,omitempty"`
	// H2DBytes, D2HBytes and DiskBytes are what the out-of-core trainer
	// moved during the step (0 when resident); HostRSS is the process's
	// resident set after the step (0 where unknown).
	H2DBytes  int64 `json:"h2d_bytes,omitempty"`
	D2HBytes  int64 `json:"d2h_bytes,omitempty"`
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	HostRSS   int64 `json:"host_rss_bytes,omitempty"`
	// Trace is the step's time breakdown when tracing (Config.Trace), nil
	// otherwise; in JSON the fields trace_wall_s, trace_compute_s,
	// trace_exposed_transfer_s, trace_optimizer_s and trace_loader_wait_s.
	// It counts the ops that had finished when the step was reported (an
	// update the trainer did not wait for counts in the next step's, or
	// only in the final Summary.Breakdowns).
	Trace *StepTrace `json:"-"`
}

// Reporter receives the metrics of every step. The training loop calls
// Report from one goroutine, in step order; implementations need not be
// safe for concurrent use and must not retain m.EvalLoss.
type Reporter interface {
	Report(m StepMetrics)
}

// MultiReporter fans each report out to every non-nil reporter, in order.
func MultiReporter(rs ...Reporter) Reporter {
	var keep multiReporter
	for _, r := range rs {
		if r != nil {
			keep = append(keep, r)
		}
	}
	return keep
}

type multiReporter []Reporter

func (m multiReporter) Report(s StepMetrics) {
	for _, r := range m {
		r.Report(s)
	}
}

// Err returns the first error of the reporters that keep one.
func (m multiReporter) Err() error { return ReporterErr(m...) }

// ReporterErr returns the first error kept by a reporter that has an
// Err() error method (JSONLReporter, MultiReporter), nil otherwise. Run
// checks it after every step and stops at the first lost report.
func ReporterErr(rs ...Reporter) error {
	for _, r := range rs {
		if e, ok := r.(interface{ Err() error }); ok {
			if err := e.Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// TruncateMetrics cuts a metrics JSONL file back to the lines of steps
// 1..step, as a run resumed from the checkpoint of step continues it: it
// keeps the longest prefix of complete lines whose "step" is at most step
// and drops everything from the first other line on (the steps a killed
// run took after its last checkpoint, and a line cut by the kill). A
// missing file is not an error.
func TruncateMetrics(path string, step int) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var keep int64
	for {
		line, err := br.ReadBytes('\n')
		if err == io.EOF {
			break // a final line without its newline is cut
		}
		if err != nil {
			return fmt.Errorf("metrics %s: %w", path, err)
		}
		var m struct {
			Step *int `json:"step"`
		}
		if json.Unmarshal(line, &m) != nil || m.Step == nil || *m.Step > step {
			break
		}
		keep += int64(len(line))
	}
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("metrics %s: %w", path, err)
	}
	if st.Size() == keep {
		return nil
	}
	if err := f.Truncate(keep); err != nil {
		return fmt.Errorf("metrics %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("metrics %s: %w", path, err)
	}
	return nil
}

// ReporterFunc adapts a function to Reporter.
type ReporterFunc func(StepMetrics)

func (f ReporterFunc) Report(m StepMetrics) { f(m) }

// JSONLReporter writes one JSON object per step to a file, one per line,
// flushed after every line so that a killed run loses at most the line
// being written. Non-finite floats are written as null. Write errors are
// kept: the first is returned by Err and Close.
type JSONLReporter struct {
	f   *os.File
	w   *bufio.Writer
	err error
	buf []byte
}

// NewJSONLReporter creates (or truncates) path.
func NewJSONLReporter(path string) (*JSONLReporter, error) {
	return openJSONL(path, os.O_TRUNC)
}

// AppendJSONLReporter opens path for appending (creating it if needed), as
// a resumed run does, after TruncateMetrics has cut the lines of the steps
// it repeats.
func AppendJSONLReporter(path string) (*JSONLReporter, error) {
	return openJSONL(path, os.O_APPEND)
}

func openJSONL(path string, mode int) (*JSONLReporter, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|mode, 0o644)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return &JSONLReporter{f: f, w: bufio.NewWriter(f)}, nil
}

// Report implements Reporter.
func (r *JSONLReporter) Report(m StepMetrics) {
	if r.err != nil {
		return
	}
	r.buf = AppendMetricsJSON(r.buf[:0], m)
	r.buf = append(r.buf, '\n')
	r.w.Write(r.buf)
	if err := r.w.Flush(); err != nil {
		r.err = fmt.Errorf("metrics %s: %w", r.f.Name(), err)
	}
}

// Err returns the first write error.
func (r *JSONLReporter) Err() error { return r.err }

// Close flushes, fsyncs and closes the file and returns the first error.
func (r *JSONLReporter) Close() error {
	err := r.err
	if ferr := r.w.Flush(); err == nil && ferr != nil {
		err = ferr
	}
	if serr := r.f.Sync(); err == nil && serr != nil {
		err = serr
	}
	if cerr := r.f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil && !strings.HasPrefix(err.Error(), "metrics") {
		err = fmt.Errorf("metrics %s: %w", r.f.Name(), err)
	}
	return err
}

// AppendMetricsJSON appends m as one JSON object (no newline). Floats use
// the shortest representation that round-trips exactly, so equal losses
// give equal text; NaN and ±Inf become null.
func AppendMetricsJSON(b []byte, m StepMetrics) []byte {
	num := func(b []byte, key string, v float64) []byte {
		b = append(b, ',', '"')
		b = append(b, key...)
		b = append(b, '"', ':')
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return append(b, "null"...)
		}
		return strconv.AppendFloat(b, v, 'g', -1, 64)
	}
	b = append(b, `{"step":`...)
	b = strconv.AppendInt(b, int64(m.Step), 10)
	b = num(b, "loss", m.Loss)
	b = num(b, "lr", m.LR)
	b = num(b, "grad_norm", m.GradNorm)
	b = num(b, "loss_scale", m.LossScale)
	b = append(b, `,"skipped":`...)
	b = strconv.AppendBool(b, m.Skipped)
	b = num(b, "tokens_per_sec", m.TokensPerSec)
	b = num(b, "samples_per_sec", m.SamplesPerSec)
	b = append(b, `,"peak_device_bytes":`...)
	b = strconv.AppendInt(b, m.PeakDeviceBytes, 10)
	b = append(b, `,"elapsed_ns":`...)
	b = strconv.AppendInt(b, int64(m.Elapsed), 10)
	b = appendReportFields(b, m, num)
	if m.EvalLoss != nil {
		b = num(b, "eval_loss", *m.EvalLoss)
	}
	if m.PredictedDevicePeak > 0 {
		b = append(b, `,"predicted_device_peak":`...)
		b = strconv.AppendInt(b, m.PredictedDevicePeak, 10)
		b = append(b, `,"measured_device_peak":`...)
		b = strconv.AppendInt(b, m.MeasuredDevicePeak, 10)
		b = num(b, "peak_error", m.PeakError)
	}
	if m.PredictedStepTime > 0 {
		b = num(b, "predicted_step_time_s", m.PredictedStepTime)
		b = num(b, "step_time_error", m.StepTimeError)
	}
	for _, f := range []struct {
		key string
		v   int64
	}{{"h2d_bytes", m.H2DBytes}, {"d2h_bytes", m.D2HBytes}, {"disk_bytes", m.DiskBytes}, {"host_rss_bytes", m.HostRSS}} {
		if f.v > 0 {
			b = append(b, ',', '"')
			b = append(b, f.key...)
			b = append(b, '"', ':')
			b = strconv.AppendInt(b, f.v, 10)
		}
	}
	if tr := m.Trace; tr != nil {
		b = num(b, "trace_wall_s", tr.Wall.Seconds())
		b = num(b, "trace_compute_s", tr.Compute.Seconds())
		b = num(b, "trace_exposed_transfer_s", tr.ExposedTransfer.Seconds())
		b = num(b, "trace_optimizer_s", tr.Optimizer.Seconds())
		b = num(b, "trace_exposed_optimizer_s", tr.ExposedOptimizer.Seconds())
		b = num(b, "trace_loader_wait_s", tr.LoaderWait.Seconds())
	}
	return append(b, '}')
}

// appendReportFields appends the fields StepMetrics carries for reports.
func appendReportFields(b []byte, m StepMetrics, num func([]byte, string, float64) []byte) []byte {
	b = append(b, `,"tokens":`...)
	b = strconv.AppendInt(b, m.Tokens, 10)
	b = num(b, "step_time_s", m.StepTime)
	if m.FLOPsPerToken > 0 {
		b = num(b, "model_flops_per_token", m.FLOPsPerToken)
	}
	if m.HostBytes > 0 || m.PredictedHostBytes > 0 {
		b = append(b, `,"host_bytes":`...)
		b = strconv.AppendInt(b, m.HostBytes, 10)
		b = append(b, `,"predicted_host_bytes":`...)
		b = strconv.AppendInt(b, m.PredictedHostBytes, 10)
	}
	return b
}

// ProgressOptions configures NewProgressReporter and NewLineReporter.
type ProgressOptions struct {
	// Steps is the run's total number of steps (for the bar and the ETA).
	Steps int
	// Every is the line reporter's interval in steps (default 10). The
	// first and last steps and every step with an eval loss are always
	// printed.
	Every int
	// Interval is the minimum time between redraws of the terminal bar
	// (default 100ms). The last step is always drawn.
	Interval time.Duration
	// Now is the clock (default time.Now); tests replace it.
	Now func() time.Time
}

func (o *ProgressOptions) ensureDefaults() {
	if o.Every <= 0 {
		o.Every = 10
	}
	if o.Interval <= 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// etaClock estimates the time left from the steps seen by this process
// (a resumed run starts counting at its first reported step).
type etaClock struct {
	opts      ProgressOptions
	firstStep int
	firstAt   time.Time
	started   bool
}

func (c *etaClock) observe(step int) (eta time.Duration, ok bool) {
	now := c.opts.Now()
	if !c.started {
		c.started, c.firstStep, c.firstAt = true, step, now
		return 0, false
	}
	done := step - c.firstStep
	if done <= 0 || step >= c.opts.Steps {
		return 0, false
	}
	per := now.Sub(c.firstAt) / time.Duration(done)
	return per * time.Duration(c.opts.Steps-step), true
}

// ProgressReporter redraws one status line on a terminal: a bar,
// step/steps, loss, the latest eval loss, tokens/s and the ETA. Call Finish
// after the run to end the line.
type ProgressReporter struct {
	mu     sync.Mutex
	w      io.Writer
	clock  etaClock
	lastAt time.Time
	drawn  bool
	eval   string
}

// NewProgressReporter returns a ProgressReporter drawing on w.
func NewProgressReporter(w io.Writer, opts ProgressOptions) *ProgressReporter {
	opts.ensureDefaults()
	return &ProgressReporter{w: w, clock: etaClock{opts: opts}}
}

// Report implements Reporter. Redraws are rate-limited to one per
// Interval, except for the last step and steps with an eval loss.
func (p *ProgressReporter) Report(m StepMetrics) {
	p.mu.Lock()
	defer p.mu.Unlock()
	eta, etaOK := p.clock.observe(m.Step)
	if m.EvalLoss != nil {
		p.eval = fmt.Sprintf(" eval %.4f", *m.EvalLoss)
	}
	now := p.clock.opts.Now()
	last := m.Step >= p.clock.opts.Steps
	if p.drawn && !last && m.EvalLoss == nil && now.Sub(p.lastAt) < p.clock.opts.Interval {
		return
	}
	p.lastAt = now
	fmt.Fprintf(p.w, "\r\x1b[K%s", progressLine(m, p.clock.opts.Steps, p.eval, eta, etaOK))
	p.drawn = true
}

// Finish ends the status line with a newline if anything was drawn.
func (p *ProgressReporter) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// LogWriter returns a writer for log lines that share the terminal with
// the bar: it clears the bar's line before each write, and the next Report
// draws the bar again below. Writes should be whole lines.
func (p *ProgressReporter) LogWriter() io.Writer { return progressLog{p} }

type progressLog struct{ p *ProgressReporter }

func (l progressLog) Write(b []byte) (int, error) {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	if l.p.drawn {
		io.WriteString(l.p.w, "\r\x1b[K")
		l.p.drawn = false
	}
	return l.p.w.Write(b)
}

// progressLine renders "[=====     ]  50/100 loss 2.3456 eval 2.5 1.2k tok/s ETA 1m05s".
func progressLine(m StepMetrics, steps int, eval string, eta time.Duration, etaOK bool) string {
	var b strings.Builder
	if steps > 0 {
		const width = 20
		frac := min(float64(m.Step)/float64(steps), 1)
		fill := int(frac * width)
		fmt.Fprintf(&b, "[%s%s] ", strings.Repeat("=", fill), strings.Repeat(" ", width-fill))
	}
	fmt.Fprintf(&b, "step %d/%d loss %.4f%s", m.Step, steps, m.Loss, eval)
	if m.Skipped {
		b.WriteString(" (skipped)")
	}
	fmt.Fprintf(&b, " %s tok/s", humanRate(m.TokensPerSec))
	if etaOK {
		fmt.Fprintf(&b, " ETA %s", FormatDuration(eta))
	}
	return b.String()
}

// LineReporter prints one plain line every Every steps: for logs and
// pipes, where a redrawn bar would be noise.
type LineReporter struct {
	w     io.Writer
	clock etaClock
}

// NewLineReporter returns a LineReporter writing to w.
func NewLineReporter(w io.Writer, opts ProgressOptions) *LineReporter {
	opts.ensureDefaults()
	return &LineReporter{w: w, clock: etaClock{opts: opts}}
}

// Report implements Reporter.
func (r *LineReporter) Report(m StepMetrics) {
	first := !r.clock.started
	eta, etaOK := r.clock.observe(m.Step)
	if !first && m.EvalLoss == nil && m.Step%r.clock.opts.Every != 0 && m.Step < r.clock.opts.Steps {
		return
	}
	line := fmt.Sprintf("step %d/%d loss %.4f", m.Step, r.clock.opts.Steps, m.Loss)
	if m.EvalLoss != nil {
		line += fmt.Sprintf(" eval_loss %.4f", *m.EvalLoss)
	}
	line += fmt.Sprintf(" lr %.3g grad_norm %.3f", m.LR, m.GradNorm)
	if m.Skipped {
		line += " skipped"
	}
	line += fmt.Sprintf(" %s tok/s", humanRate(m.TokensPerSec))
	if etaOK {
		line += " eta " + FormatDuration(eta)
	}
	fmt.Fprintln(r.w, line)
}

// humanRate prints a rate with a k/M suffix: 950, 12.3k, 1.20M.
func humanRate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// FormatDuration prints d rounded for people: 42s, 3m05s or 1h02m.
func FormatDuration(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	}
	return fmt.Sprintf("%dh%02dm", s/3600, (s%3600)/60)
}

var errNoMetrics = errors.New("no metrics")

// ReadMetricsJSONL parses a metrics file written by JSONLReporter. A
// resumed run appends the steps it repeats, so a step may appear more than
// once; the result keeps every line in file order. A line cut short by a
// kill (the last one, without a newline) is ignored.
func ReadMetricsJSONL(path string) ([]StepMetrics, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []StepMetrics
	lines := strings.Split(string(data), "\n")
	for i, ln := range lines {
		if ln == "" || (i == len(lines)-1) {
			continue // empty, or the unterminated last line
		}
		m, err := parseMetricsLine(ln)
		if err != nil {
			return nil, fmt.Errorf("metrics %s:%d: %w", path, i+1, err)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("metrics %s: %w", path, errNoMetrics)
	}
	return out, nil
}

// metricsLine is StepMetrics as JSON with nullable floats.
type metricsLine struct {
	Step            int      `json:"step"`
	Loss            *float64 `json:"loss"`
	LR              *float64 `json:"lr"`
	GradNorm        *float64 `json:"grad_norm"`
	LossScale       *float64 `json:"loss_scale"`
	Skipped         bool     `json:"skipped"`
	TokensPerSec    *float64 `json:"tokens_per_sec"`
	SamplesPerSec   *float64 `json:"samples_per_sec"`
	PeakDeviceBytes int64    `json:"peak_device_bytes"`
	ElapsedNS       int64    `json:"elapsed_ns"`
	EvalLoss        *float64 `json:"eval_loss"`
	Tokens          int64    `json:"tokens"`
	StepTime        float64  `json:"step_time_s"`
	TraceWall       *float64 `json:"trace_wall_s"`
	TraceCompute    *float64 `json:"trace_compute_s"`
	TraceExposed    *float64 `json:"trace_exposed_transfer_s"`
	TraceOptimizer  *float64 `json:"trace_optimizer_s"`
	TraceExposedOpt *float64 `json:"trace_exposed_optimizer_s"`
	TraceLoader     *float64 `json:"trace_loader_wait_s"`
}

func parseMetricsLine(s string) (StepMetrics, error) {
	var l metricsLine
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return StepMetrics{}, err
	}
	f := func(p *float64) float64 {
		if p == nil {
			return math.NaN()
		}
		return *p
	}
	m := StepMetrics{Step: l.Step, Loss: f(l.Loss), LR: f(l.LR), GradNorm: f(l.GradNorm), LossScale: f(l.LossScale),
		Skipped: l.Skipped, TokensPerSec: f(l.TokensPerSec), SamplesPerSec: f(l.SamplesPerSec),
		PeakDeviceBytes: l.PeakDeviceBytes, Elapsed: time.Duration(l.ElapsedNS), EvalLoss: l.EvalLoss,
		Tokens: l.Tokens, StepTime: l.StepTime}
	if l.TraceCompute != nil {
		d := func(p *float64) time.Duration {
			if p == nil {
				return 0
			}
			return time.Duration(math.Round(*p * 1e9))
		}
		m.Trace = &StepTrace{Wall: d(l.TraceWall), Compute: d(l.TraceCompute), ExposedTransfer: d(l.TraceExposed),
			Optimizer: d(l.TraceOptimizer), ExposedOptimizer: d(l.TraceExposedOpt), LoaderWait: d(l.TraceLoader)}
	}
	return m, nil
}

// Phase is a named span of a run's start-up.
type Phase struct {
	Name string
	D    time.Duration
}

// FormatPhases writes phases as "open 1.2s, plan 0.3s, ...".
func FormatPhases(phases []Phase) string {
	var b strings.Builder
	for i, p := range phases {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.1fs", p.Name, p.D.Seconds())
	}
	return b.String()
}
