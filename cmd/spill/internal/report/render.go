package report

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"html/template"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/spill-ml/spill/kernels"
)

// Chart is one rendered plot.
type Chart struct {
	Name    string // file name without .png
	Title   string
	Caption string
	PNG     []byte
}

// Report is a rendered run.
type Report struct {
	Run     *Run
	Charts  []Chart
	Missing []string // plots left out, with what would draw them
	Summary [][2]string
}

// Plot size.
const (
	plotW = 9 * vg.Inch
	plotH = 4 * vg.Inch
)

// Render draws every plot the run's fields allow.
func Render(r *Run) (*Report, error) {
	rep := &Report{Run: r}
	for _, f := range []func(*Run, *Report) error{lossChart, lossTokensChart, throughputChart, tflopsChart, memoryChart, timeChart, transferChart} {
		if err := f(r, rep); err != nil {
			return nil, err
		}
	}
	rep.Summary = summary(r)
	return rep, nil
}

// series returns the points (x, y*scale) of the steps that have both.
func (r *Run) series(x, y string, scale float64) plotter.XYs {
	var xys plotter.XYs
	for _, s := range r.Steps {
		xv, ok1 := s.Get(x)
		yv, ok2 := s.Get(y)
		if ok1 && ok2 {
			xys = append(xys, plotter.XY{X: xv, Y: yv * scale})
		}
	}
	return xys
}

// has reports whether some step has field k with a value other than 0.
func (r *Run) has(k string) bool {
	for _, s := range r.Steps {
		if v, ok := s.Get(k); ok && v != 0 {
			return true
		}
	}
	return false
}

// first returns the first step's finite value of k.
func (r *Run) first(k string) (float64, bool) {
	for _, s := range r.Steps {
		if v, ok := s.Get(k); ok {
			return v, true
		}
	}
	return 0, false
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p
}

// line adds a named line in the i-th palette colour; dashed for a
// prediction or a budget.
func line(p *plot.Plot, name string, xys plotter.XYs, i int, dashed bool) error {
	if len(xys) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.Color = plotutil.Color(i)
	l.Width = vg.Points(1.5)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	}
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

// points adds a named scatter (eval losses: one every eval_every steps).
func points(p *plot.Plot, name string, xys plotter.XYs, i int) error {
	if len(xys) == 0 {
		return nil
	}
	s, err := plotter.NewScatter(xys)
	if err != nil {
		return err
	}
	s.Color = plotutil.Color(i)
	s.Shape = draw.CircleGlyph{}
	s.Radius = vg.Points(3)
	p.Add(s)
	p.Legend.Add(name, s)
	return nil
}

// hline spans the run's steps at y.
func (r *Run) hline(xkey string, y float64) plotter.XYs {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range r.Steps {
		if v, ok := s.Get(xkey); ok {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if math.IsInf(lo, 0) {
		return nil
	}
	return plotter.XYs{{X: lo, Y: y}, {X: hi, Y: y}}
}

func (rep *Report) add(name, title, caption string, p *plot.Plot) error {
	wt, err := p.WriterTo(plotW, plotH, "png")
	if err != nil {
		return fmt.Errorf("report: plot %s: %w", name, err)
	}
	var buf bytes.Buffer
	if _, err := wt.WriteTo(&buf); err != nil {
		return fmt.Errorf("report: plot %s: %w", name, err)
	}
	rep.Charts = append(rep.Charts, Chart{Name: name, Title: title, Caption: caption, PNG: buf.Bytes()})
	return nil
}

func lossChart(r *Run, rep *Report) error {
	p := newPlot("Loss", "step", "loss")
	if err := line(p, "train loss", r.series("step", "loss", 1), 0, false); err != nil {
		return err
	}
	if err := points(p, "eval loss", r.series("step", "eval_loss", 1), 1); err != nil {
		return err
	}
	return rep.add("loss", "Loss against steps", "Training loss of every step; eval loss where the run evaluated (--eval-every).", p)
}

func lossTokensChart(r *Run, rep *Report) error {
	if !r.has("tokens") {
		rep.Missing = append(rep.Missing, "loss against tokens: the metrics lines have no tokens field (written by spill train from this version on)")
		return nil
	}
	p := newPlot("Loss against tokens", "tokens trained (millions)", "loss")
	x := func(y string) plotter.XYs {
		xys := r.series("tokens", y, 1)
		for i := range xys {
			xys[i].X /= 1e6
		}
		return xys
	}
	if err := line(p, "train loss", x("loss"), 0, false); err != nil {
		return err
	}
	if err := points(p, "eval loss", x("eval_loss"), 1); err != nil {
		return err
	}
	return rep.add("loss_tokens", "Loss against tokens", "The same losses against the targets (tokens, or records for an MLP) trained on, resumed steps included.", p)
}

func throughputChart(r *Run, rep *Report) error {
	p := newPlot("Throughput", "step", "tokens/s (thousands)")
	if err := line(p, "measured", r.series("step", "tokens_per_sec", 1e-3), 0, false); err != nil {
		return err
	}
	caption := "Tokens (or records) per second of each optimizer step."
	if v, ok := r.Plan["tokens_per_s"].(float64); ok && v > 0 {
		if err := line(p, "plan (spill plan)", r.hline("step", v*1e-3), 1, true); err != nil {
			return err
		}
		caption += " Dashed: the plan's prediction (for the hardware the plan assumed)."
	}
	return rep.add("throughput", "Throughput", caption, p)
}

func tflopsChart(r *Run, rep *Report) error {
	if !r.has("model_flops_per_token") {
		rep.Missing = append(rep.Missing, "model TFLOP/s: the metrics lines have no model_flops_per_token field (written by spill train from this version on)")
		return nil
	}
	var xys plotter.XYs
	for _, s := range r.Steps {
		st, ok1 := s.Get("step")
		tps, ok2 := s.Get("tokens_per_sec")
		fpt, ok3 := s.Get("model_flops_per_token")
		if ok1 && ok2 && ok3 {
			xys = append(xys, plotter.XY{X: st, Y: tps * fpt / 1e12})
		}
	}
	p := newPlot("Model TFLOP/s", "step", "TFLOP/s")
	if err := line(p, "model FLOPs / step time", xys, 2, false); err != nil {
		return err
	}
	return rep.add("tflops", "Model TFLOP/s", "Model FLOPs (3x each layer's forward per token: the matmuls, 2 per parameter, and attention, 12·width·context per block; no recomputation) times tokens/s: what the hardware delivers to the model.", p)
}

func memoryChart(r *Run, rep *Report) error {
	const gib = 1.0 / (1 << 30)
	p := newPlot("Memory", "step", "GiB")
	i := 0
	add := func(name, key string, dashed bool) error {
		if !r.has(key) {
			return nil
		}
		i++
		return line(p, name, r.series("step", key, gib), i-1, dashed)
	}
	for _, c := range []struct {
		name, key string
		dashed    bool
	}{
		{"device peak (allocator)", "peak_device_bytes", false},
		{"device peak (trainer, measured)", "measured_device_peak", false},
		{"device peak (planned)", "predicted_device_peak", true},
		{"host state (measured)", "host_bytes", false},
		{"host state (planned)", "predicted_host_bytes", true},
	} {
		if err := add(c.name, c.key, c.dashed); err != nil {
			return err
		}
	}
	caption := "Device memory at its peak so far and the host memory of offloaded state, against the trainer's plan (dashed)."
	if tiers, ok := r.Plan["memory"].([]any); ok {
		for _, t := range tiers {
			m, _ := t.(map[string]any)
			tier, _ := m["tier"].(string)
			if b, ok := m["budget"].(float64); ok && b > 0 && (tier == "device" || tier == "host") {
				i++
				if err := line(p, tier+" budget (spill plan)", r.hline("step", b*gib), i-1, true); err != nil {
					return err
				}
			}
		}
		caption += " Budgets from the plan file."
	}
	if i == 0 {
		rep.Missing = append(rep.Missing, "memory: the metrics lines have no memory fields")
		return nil
	}
	return rep.add("memory", "Memory against the plan", caption, p)
}

// timeParts are the components of a step's wall time, each from the first
// of its fields a line has.
var timeParts = []struct {
	name string
	keys []string
}{
	{"compute", []string{"trace_compute_s"}},
	{"exposed transfer", []string{"exposed_transfer_s", "trace_exposed_transfer_s"}},
	{"host optimizer", []string{"trace_optimizer_s"}},
	{"loader wait", []string{"trace_loader_wait_s"}},
}

func timeChart(r *Run, rep *Report) error {
	split := false
	for _, t := range timeParts {
		for _, k := range t.keys {
			split = split || r.has(k)
		}
	}
	p := newPlot("Time per step", "step", "seconds")
	wall := "step_time_s"
	if !r.has(wall) {
		wall = "trace_wall_s"
	}
	if !split {
		rep.Missing = append(rep.Missing, "time split into compute, exposed transfer, host optimizer and loader wait: run spill train with --trace")
		if !r.has(wall) {
			return nil
		}
		if err := line(p, "step time", r.series("step", wall, 1), 0, false); err != nil {
			return err
		}
		return rep.add("time", "Time per step", "Wall time of each step.", p)
	}
	// Stacked areas, bottom to top: the parts, then the rest of the wall
	// time.
	n := len(r.Steps)
	base := make([]float64, n)
	layer := func(name string, i int, val func(k int, s Step) float64) error {
		top := make([]float64, n)
		var poly plotter.XYs
		for k, s := range r.Steps {
			top[k] = base[k] + max(0, val(k, s))
			poly = append(poly, plotter.XY{X: s["step"], Y: top[k]})
		}
		for k := n - 1; k >= 0; k-- {
			poly = append(poly, plotter.XY{X: r.Steps[k]["step"], Y: base[k]})
		}
		pg, err := plotter.NewPolygon(poly)
		if err != nil {
			return err
		}
		c := plotutil.Color(i)
		pg.Color = c
		pg.LineStyle.Color = color.Transparent
		p.Add(pg)
		p.Legend.Add(name, pg)
		base = top
		return nil
	}
	for i, t := range timeParts {
		keys := t.keys
		if err := layer(t.name, i, func(_ int, s Step) float64 {
			for _, k := range keys {
				if v, ok := s.Get(k); ok {
					return v
				}
			}
			return 0
		}); err != nil {
			return err
		}
	}
	parts := append([]float64(nil), base...)
	if err := layer("other (host work, waits)", len(timeParts), func(k int, s Step) float64 {
		if w, ok := s.Get(wall); ok {
			return w - parts[k]
		}
		return 0
	}); err != nil {
		return err
	}
	return rep.add("time", "Time per step", "Each step's wall time split as the trace saw it: device compute, transfer time not hidden behind compute, the host optimizer, waiting for the data loader, and the rest.", p)
}

func transferChart(r *Run, rep *Report) error {
	keys := []struct{ name, key string }{{"host to device", "h2d_bytes"}, {"device to host", "d2h_bytes"}, {"disk", "disk_bytes"}}
	p := newPlot("Bytes moved per step", "step", "GiB")
	found := false
	for i, k := range keys {
		if r.has(k.key) {
			found = true
			if err := line(p, k.name, r.series("step", k.key, 1.0/(1<<30)), i, false); err != nil {
				return err
			}
		}
	}
	if !found {
		rep.Missing = append(rep.Missing, "bytes moved between tiers: the metrics lines have no h2d_bytes, d2h_bytes or disk_bytes fields (an out-of-core run of a spill that records them)")
		return nil
	}
	return rep.add("transfers", "Bytes moved per step", "Bytes copied host to device, device to host, and to or from the disk tier in each step.", p)
}

// summary is the table at the top of the page.
func summary(r *Run) [][2]string {
	last := r.Steps[len(r.Steps)-1]
	var rows [][2]string
	row := func(k, format string, args ...any) { rows = append(rows, [2]string{k, fmt.Sprintf(format, args...)}) }
	row("metrics", "%s (%d steps, %v to %v)", r.Metrics, len(r.Steps), r.Steps[0]["step"], last["step"])
	if v, ok := r.first("loss"); ok {
		l, _ := last.Get("loss")
		row("loss", "%.4f at the first step, %.4f at the last", v, l)
	}
	for i := len(r.Steps) - 1; i >= 0; i-- {
		if v, ok := r.Steps[i].Get("eval_loss"); ok {
			row("eval loss", "%.4f at step %v", v, r.Steps[i]["step"])
			break
		}
	}
	if v, ok := last.Get("tokens"); ok && v > 0 {
		row("tokens trained", "%.0f", v)
	}
	var tps, n float64
	for _, s := range r.Steps {
		if v, ok := s.Get("tokens_per_sec"); ok {
			tps += v
			n++
		}
	}
	if n > 0 {
		row("throughput", "%.0f tokens/s (mean over steps)", tps/n)
	}
	if v, ok := last.Get("elapsed_ns"); ok {
		row("elapsed", "%s (of the last process)", time.Duration(v).Round(time.Millisecond))
	}
	if v, ok := last.Get("peak_device_bytes"); ok {
		row("peak device", "%s", kernels.FormatBytes(int64(v)))
	}
	if r.Plan != nil {
		row("plan", "%s: %v, micro-batch %v x %v, weights %v, optimizer %v", r.PlanPath, r.Plan["model"], r.Plan["micro_batch"], r.Plan["accum"], r.Plan["weights"], r.Plan["optimizer"])
	}
	if r.TracePath != "" {
		row("trace", "%s (open in https://ui.perfetto.dev)", r.TracePath)
	}
	return rows
}

var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>spill run report: {{.Run.Metrics}}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 960px; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
td, th { padding: 0.2em 1em 0.2em 0; text-align: left; vertical-align: top; }
td:first-child { color: #666; }
figure { margin: 0 0 2em 0; }
figure img { width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.9em; }
</style></head><body>
<h1>spill run report</h1>
<table>{{range .Summary}}<tr><td>{{index . 0}}</td><td>{{index . 1}}</td></tr>{{end}}</table>
{{range .Charts}}<figure id="{{.Name}}"><h2>{{.Title}}</h2><img alt="{{.Title}}" src="data:image/png;base64,{{.Base64}}"><figcaption>{{.Caption}}</figcaption></figure>
{{end}}{{if .Run.Trace}}<h2>Trace: busy time by track</h2>
<table><tr><th>track</th><th>busy</th><th>spans</th></tr>{{range .Run.Trace}}<tr><td>{{.Track}}</td><td>{{printf "%.3f s" .Seconds}}</td><td>{{.Spans}}</td></tr>{{end}}</table>
{{end}}{{if .Missing}}<h2>Not drawn</h2><ul>{{range .Missing}}<li>{{.}}</li>{{end}}</ul>{{end}}
</body></html>
`))

type chartView struct {
	Chart
	Base64 string
}

// HTML writes the page: every plot is inlined as a data: URI, so the file
// opens offline on its own.
func (rep *Report) HTML() ([]byte, error) {
	var views []chartView
	for _, c := range rep.Charts {
		views = append(views, chartView{c, base64.StdEncoding.EncodeToString(c.PNG)})
	}
	var buf bytes.Buffer
	err := page.Execute(&buf, struct {
		*Report
		Charts []chartView
	}{rep, views})
	return buf.Bytes(), err
}

// Write writes DIR/index.html and DIR/NAME.png for each chart (creating
// DIR), each through a temporary file, fsync and rename, and returns the
// paths written.
func (rep *Report) Write(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var written []string
	for _, c := range rep.Charts {
		p := filepath.Join(dir, c.Name+".png")
		if err := writeFileAtomic(p, c.PNG); err != nil {
			return written, err
		}
		written = append(written, p)
	}
	html, err := rep.HTML()
	if err != nil {
		return written, fmt.Errorf("report: %w", err)
	}
	p := filepath.Join(dir, "index.html")
	if err := writeFileAtomic(p, html); err != nil {
		return written, err
	}
	return append(written, p), nil
}

func writeFileAtomic(path string, data []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
			err = fmt.Errorf("report: %s: %w", path, err)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
