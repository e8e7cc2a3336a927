package engine

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestJSONLReporterRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.jsonl")
	r, err := NewJSONLReporter(path)
	if err != nil {
		t.Fatal(err)
	}
	ev := 2.0000000000000004
	in := []StepMetrics{
		{Step: 1, Loss: 5.545177444479562, LR: 1e-4, GradNorm: 1.5, LossScale: 65536, TokensPerSec: 1234.5, PeakDeviceBytes: 1 << 20, Elapsed: time.Second},
		{Step: 2, Loss: math.NaN(), LR: 2e-4, GradNorm: math.Inf(1), Skipped: true, EvalLoss: &ev},
		{Step: 3, Loss: 0.1 + 0.2},
	}
	for _, m := range in {
		r.Report(m)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// Appending (a resumed run) adds lines after the old ones.
	a, err := AppendJSONLReporter(path)
	if err != nil {
		t.Fatal(err)
	}
	a.Report(StepMetrics{Step: 3, Loss: 0.1 + 0.2})
	a.Close()
	out, err := ReadMetricsJSONL(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 4 {
		t.Fatalf("read %d lines, want 4", len(out))
	}
	if out[0].Loss != in[0].Loss || out[0].LR != in[0].LR || out[0].Elapsed != time.Second || out[0].PeakDeviceBytes != 1<<20 {
		t.Errorf("line 1 = %+v", out[0])
	}
	if !math.IsNaN(out[1].Loss) || !math.IsNaN(out[1].GradNorm) || !out[1].Skipped || out[1].EvalLoss == nil || *out[1].EvalLoss != ev {
		t.Errorf("line 2 = %+v", out[1])
	}
	if math.Float64bits(out[2].Loss) != math.Float64bits(0.1+0.2) || out[3].Loss != out[2].Loss || out[3].Step != 3 {
		t.Errorf("lines 3,4 = %+v %+v", out[2], out[3])
	}
	raw, _ := os.ReadFile(path)
	if !strings.Contains(string(raw), `"loss":null`) || strings.Contains(string(raw), "NaN") {
		t.Errorf("non-finite floats not written as null:\n%s", raw)
	}
	// A truncated last line (killed mid-write) is ignored; a corrupt middle line is an error naming it.
	os.WriteFile(path, append(raw, []byte(`{"step":4,"lo`)...), 0o644)
	if out, err := ReadMetricsJSONL(path); err != nil || len(out) != 4 {
		t.Errorf("truncated tail: %d lines, %v", len(out), err)
	}
	os.WriteFile(path, []byte("{\"step\":1}\nxx\n"), 0o644)
	if _, err := ReadMetricsJSONL(path); err == nil || !strings.Contains(err.Error(), ":2:") {
		t.Errorf("corrupt line: %v", err)
	}
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestLineReporter(t *testing.T) {
	var b bytes.Buffer
	clk := &fakeClock{t: time.Unix(0, 0)}
	r := NewLineReporter(&b, ProgressOptions{Steps: 30, Every: 10, Now: clk.now})
	ev := 1.25
	for s := 1; s <= 30; s++ {
		m := StepMetrics{Step: s, Loss: float64(s), TokensPerSec: 20000}
		if s == 15 {
			m.EvalLoss = &ev
		}
		r.Report(m)
		clk.t = clk.t.Add(time.Second)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	var steps []string
	for _, l := range lines {
		steps = append(steps, strings.Fields(l)[1])
	}
	if got := strings.Join(steps, " "); got != "1/30 10/30 15/30 20/30 30/30" {
		t.Errorf("printed steps %q", got)
	}
	if !strings.Contains(lines[2], "eval_loss 1.2500") || !strings.Contains(lines[1], "20.0k tok/s") {
		t.Errorf("lines: %q", lines)
	}
	// After step 10 (9 s for 9 steps), 20 steps are left: 20s.
	if !strings.Contains(lines[1], "eta 20s") {
		t.Errorf("eta in %q", lines[1])
	}
}

func TestProgressReporter(t *testing.T) {
	var b bytes.Buffer
	clk := &fakeClock{t: time.Unix(0, 0)}
	p := NewProgressReporter(&b, ProgressOptions{Steps: 100, Interval: time.Second, Now: clk.now})
	for s := 51; s <= 100; s++ { // a resumed run starting at 51
		p.Report(StepMetrics{Step: s, Loss: 2.5})
		clk.t = clk.t.Add(100 * time.Millisecond)
	}
	p.Finish()
	out := b.String()
	// A log line clears the bar; the next report redraws it at once.
	b.Reset()
	fmt.Fprintln(p.LogWriter(), "checkpoint x")
	p.Report(StepMetrics{Step: 100, Loss: 2.5})
	fmt.Fprintln(p.LogWriter(), "checkpoint y")
	if got := b.String(); !strings.HasPrefix(got, "checkpoint x\n\r\x1b[K[") || !strings.HasSuffix(got, "\r\x1b[Kcheckpoint y\n") {
		t.Errorf("log through the bar: %q", got)
	}
	draws := strings.Count(out, "\r\x1b[K")
	if draws < 5 || draws > 7 { // first, ~every 10 steps (1 s), last
		t.Errorf("%d redraws:\n%q", draws, out)
	}
	if !strings.HasSuffix(out, "step 100/100 loss 2.5000 0 tok/s\n") || !strings.Contains(out, "[====================]") {
		t.Errorf("last draw: %q", out[strings.LastIndex(out, "\r"):])
	}
	if !strings.Contains(out, "ETA 4s") { // at step 61: 1 s per 10 steps, 39 left
		t.Errorf("no ETA in %q", out)
	}
}

func TestMultiReporter(t *testing.T) {
	var got []int
	r := MultiReporter(nil, ReporterFunc(func(m StepMetrics) { got = append(got, m.Step) }),
		ReporterFunc(func(m StepMetrics) { got = append(got, -m.Step) }))
	r.Report(StepMetrics{Step: 3})
	if len(got) != 2 || got[0] != 3 || got[1] != -3 {
		t.Errorf("got %v", got)
	}
}
