package engine

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spill-ml/spill/stream"
)

// TestStepBreakdownsMatchesStream: the windowed breakdown equals
// stream.Breakdowns over the whole trace, spans that straddle two steps
// included.
func TestStepBreakdownsMatchesStream(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	var spans []stream.Span
	for st := 0; st < 5; st++ {
		a := ms(100 * st)
		spans = append(spans,
			stream.Span{Track: "steps", Cat: stream.Step, Start: a, End: a + ms(90), Step: st + 1},
			stream.Span{Track: "loader", Cat: stream.Loader, Start: a, End: a + ms(5), Step: st + 1},
			stream.Span{Track: "compute", Cat: stream.Compute, Start: a + ms(5), End: a + ms(60), Step: st + 1},
			stream.Span{Track: "h2d", Cat: stream.H2D, Start: a + ms(50), End: a + ms(70), Step: st + 1},
			// An update that runs on into the next step.
			stream.Span{Track: "optimizer", Cat: stream.Optimizer, Start: a + ms(80), End: a + ms(130), Step: st + 1},
		)
	}
	// One long span across three steps.
	spans = append(spans, stream.Span{Track: "d2h", Cat: stream.D2H, Start: ms(150), End: ms(420), Step: 2})
	sorted := append([]stream.Span(nil), spans...) // sorted by start, as Recorder.Spans returns them
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Start < sorted[j].Start })
	want := stream.Breakdowns(sorted)
	got := stepBreakdowns(sorted, func(int) bool { return true })
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("windowed breakdowns\n%+v\nwant\n%+v", got, want)
	}
	one := stepBreakdowns(sorted, func(s int) bool { return s == 3 })
	if len(one) != 1 || !reflect.DeepEqual(one[0], want[2]) {
		t.Errorf("step 3 alone: %+v, want %+v", one, want[2])
	}
	if want[2].Optimizer != ms(30+10) {
		t.Errorf("step 3 optimizer %v, want the previous step's tail (30ms) plus its own first 10ms", want[2].Optimizer)
	}
	m := MeanStepTrace(want)
	if m.Wall != ms(90) || m.LoaderWait != ms(5) || m.Compute != ms(55) {
		t.Errorf("mean %+v", m)
	}
}

// TestMetricsTraceFields: the breakdown round-trips through the JSONL
// line, and a line without one has no trace fields.
func TestMetricsTraceFields(t *testing.T) {
	tr := &StepTrace{Wall: 12345678, Compute: 9000001, ExposedTransfer: 17, Optimizer: 2000000, LoaderWait: 333}
	line := string(AppendMetricsJSON(nil, StepMetrics{Step: 4, Loss: 1, Trace: tr}))
	for _, k := range []string{"trace_wall_s", "trace_compute_s", "trace_exposed_transfer_s", "trace_optimizer_s", "trace_exposed_optimizer_s", "trace_loader_wait_s"} {
		if !strings.Contains(line, `"`+k+`":`) {
			t.Errorf("line lacks %s: %s", k, line)
		}
	}
	m, err := parseMetricsLine(line)
	if err != nil {
		t.Fatal(err)
	}
	if m.Trace == nil || *m.Trace != *tr {
		t.Errorf("parsed %+v, want %+v", m.Trace, tr)
	}
	plain := string(AppendMetricsJSON(nil, StepMetrics{Step: 4, Loss: 1}))
	if strings.Contains(plain, "trace_") {
		t.Errorf("untraced line has trace fields: %s", plain)
	}
	if m, err := parseMetricsLine(plain); err != nil || m.Trace != nil {
		t.Errorf("untraced line parsed to %+v, %v", m.Trace, err)
	}
}

// TestRunTraceInterrupted: tracing does not change the losses, and a run
// interrupted after two steps still writes a Chrome trace of those steps,
// with the resident trainer's compute, transfer, optimizer and loader
// spans, and reports their breakdown.
func TestRunTraceInterrupted(t *testing.T) {
	data := writeTokens(t, 32, 16, 4000)
	cfg := tinyConfig(data)
	cfg.Steps, cfg.Warmup = 3, 1
	var plain stepLog
	if _, err := Run(context.Background(), cfg, RunOptions{Reporter: &plain}); err != nil {
		t.Fatal(err)
	}

	cfg.Trace = filepath.Join(t.TempDir(), "trace.json")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var traced stepLog
	rep := ReporterFunc(func(m StepMetrics) {
		traced.Report(m)
		if m.Step == 2 {
			cancel()
		}
	})
	sum, err := Run(ctx, cfg, RunOptions{Reporter: rep})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if len(traced.m) != 2 {
		t.Fatalf("%d steps reported, want 2", len(traced.m))
	}
	for i, m := range traced.m {
		if math.Float64bits(m.Loss) != math.Float64bits(plain.m[i].Loss) {
			t.Errorf("step %d: traced loss %v, untraced %v", m.Step, m.Loss, plain.m[i].Loss)
		}
		// The line counts the ops stamped by then (the watchers may lag).
		if m.Trace == nil || m.Trace.Wall <= 0 || m.Trace.Compute < 0 || m.Trace.Wall < m.Trace.Compute || m.Trace.LoaderWait < 0 {
			t.Errorf("step %d: trace %+v", m.Step, m.Trace)
		}
		if plain.m[i].Trace != nil {
			t.Errorf("untraced step %d has a trace", m.Step)
		}
	}
	if sum == nil || sum.Trace != cfg.Trace || len(sum.Breakdowns) != 2 || sum.MeanTrace == nil {
		t.Fatalf("summary %+v", sum)
	}
	for _, b := range sum.Breakdowns {
		if b.Compute <= 0 || b.Compute > b.Wall || b.LoaderWait <= 0 {
			t.Errorf("final breakdown %+v", b)
		}
	}
	raw, err := os.ReadFile(cfg.Trace)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []struct {
			Name string `json:"name"`
			Cat  string `json:"cat"`
			Ph   string `json:"ph"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("trace is not JSON: %v", err)
	}
	cats := map[string]int{}
	for _, e := range doc.TraceEvents {
		if e.Ph == "X" {
			cats[e.Cat]++
		}
	}
	// Per step: Accum uploads and loss copies, a forward and a backward
	// per layer (4: embedding, 2 blocks, head; the merge of the head's tied
	// gradients and the gradient statistics are part of the backwards),
	// one AdamW per layer.
	if cats["step"] != 2 || cats["loader"] != 2 || cats["h2d"] != 2 || cats["d2h"] != 2 || cats["compute"] != 2*2*4 ||
		cats["optimizer"] != 2*4 {
		t.Errorf("span counts by category %v", cats)
	}
}

// TestTraceConfig: the TOML key trace sets Config.Trace, which is not part
// of the resume hash, and may not name the metrics file.
func TestTraceConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.toml")
	if err := os.WriteFile(path, []byte("trace = \"out/trace.json\"\nmetrics = \"m.jsonl\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Trace != "out/trace.json" {
		t.Fatalf("trace = %q", cfg.Trace)
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plain := cfg
	plain.Trace = ""
	if cfg.Hash() != plain.Hash() {
		t.Error("trace changes the resume hash")
	}
	cfg.Trace = cfg.Metrics
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "trace") {
		t.Errorf("trace = metrics: %v", err)
	}
}
