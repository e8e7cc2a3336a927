package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// chromeTrace is the part of a Chrome trace JSON file the tests read.
type chromeTrace struct {
	TraceEvents []struct {
		Name string   `json:"name"`
		Cat  string   `json:"cat"`
		Ph   string   `json:"ph"`
		Ts   *float64 `json:"ts"`
		Dur  float64  `json:"dur"` // omitted for zero-length spans
		Pid  int      `json:"pid"`
		Tid  *int     `json:"tid"`
	} `json:"traceEvents"`
}

// readTrace parses path as Chrome trace JSON, checks every complete
// event has a name, a timestamp, a non-negative duration and a thread,
// and returns the number of complete events by category.
func readTrace(t *testing.T, path string) map[string]int {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tr chromeTrace
	if err := json.Unmarshal(raw, &tr); err != nil {
		t.Fatalf("%s is not Chrome trace JSON: %v", path, err)
	}
	cats := map[string]int{}
	steps := 0
	for _, e := range tr.TraceEvents {
		if e.Ph != "X" {
			continue
		}
		if e.Name == "" || e.Ts == nil || *e.Ts < 0 || e.Dur < 0 || e.Tid == nil || *e.Tid <= 0 {
			t.Errorf("%s: bad event %+v", path, e)
		}
		if e.Cat == "step" && e.Dur > 0 {
			steps++
		}
		cats[e.Cat]++
	}
	if steps != cats["step"] {
		t.Errorf("%s: %d of %d step spans have a duration", path, steps, cats["step"])
	}
	return cats
}

// traceFields reads the trace_* fields of every metrics line (nil maps
// for lines without any).
func traceFields(t *testing.T, path string) []map[string]float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var m map[string]float64
		for k, v := range line {
			if strings.HasPrefix(k, "trace_") {
				if m == nil {
					m = map[string]float64{}
				}
				x, _ := v.(float64)
				m[k] = x
			}
		}
		out = append(out, m)
	}
	return out
}

var traceKeys = []string{"trace_wall_s", "trace_compute_s", "trace_exposed_transfer_s", "trace_optimizer_s", "trace_loader_wait_s"}

// TestTrainTrace: --trace writes Chrome trace JSON with compute, loader,
// copy and optimizer spans, resident and out of core (a device budget of
// 1/8 of the resident peak), adds the breakdown to every metrics line and
// the summary; without --trace there is no file and no field.
func TestTrainTrace(t *testing.T) {
	dir := t.TempDir()
	base := []string{"train", "--eval-every", "0", "--quiet", "--threads", "2", "--steps", "2"}
	run := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := runMain(context.Background(), append(base, args...), &out, &errb); code != exitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out.String(), errb.String())
		}
		return out.String()
	}

	plainMetrics := filepath.Join(dir, "plain.jsonl")
	out := run("--metrics", plainMetrics)
	if strings.Contains(out, "trace") {
		t.Errorf("untraced summary mentions a trace:\n%s", out)
	}
	for i, m := range traceFields(t, plainMetrics) {
		if m != nil {
			t.Errorf("untraced line %d has %v", i+1, m)
		}
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*.json")); len(files) != 0 {
		t.Errorf("untraced run wrote %v", files)
	}
	peak := readOffloadMetrics(t, plainMetrics)[0].Peak

	for _, c := range []struct {
		name string
		args []string
		cats []string
		plan string
	}{
		{name: "resident", cats: []string{"step", "loader", "compute", "h2d", "d2h", "optimizer"}},
		{name: "ooc", args: []string{"--device-memory", strconv.FormatInt(peak/8, 10)},
			cats: []string{"step", "loader", "compute", "h2d", "d2h", "optimizer"}, plan: "out of core"},
	} {
		trace := filepath.Join(dir, c.name+".json")
		metrics := filepath.Join(dir, c.name+".jsonl")
		out := run(append(c.args, "--trace", trace, "--metrics", metrics)...)
		if !strings.Contains(out, c.plan) || !strings.Contains(out, "trace         "+trace) || !strings.Contains(out, "loader wait") {
			t.Errorf("%s: summary:\n%s", c.name, out)
		}
		cats := readTrace(t, trace)
		for _, cat := range c.cats {
			if cats[cat] == 0 {
				t.Errorf("%s: no %s spans in the trace (%v)", c.name, cat, cats)
			}
		}
		if cats["step"] != 2 || cats["loader"] < 2 {
			t.Errorf("%s: %d step and %d loader spans, want 2 and at least 2", c.name, cats["step"], cats["loader"])
		}
		lines := traceFields(t, metrics)
		if len(lines) != 2 {
			t.Fatalf("%s: %d metric lines", c.name, len(lines))
		}
		for i, m := range lines {
			for _, k := range traceKeys {
				v, ok := m[k]
				if !ok || v < 0 {
					t.Errorf("%s: line %d: %s = %v (present %v)", c.name, i+1, k, v, ok)
				}
			}
			if m["trace_wall_s"] <= 0 || m["trace_compute_s"] > m["trace_wall_s"] {
				t.Errorf("%s: line %d: compute %v of a %v step", c.name, i+1, m["trace_compute_s"], m["trace_wall_s"])
			}
		}
		if files, _ := filepath.Glob(filepath.Join(dir, "."+c.name+".json.tmp-*")); len(files) != 0 {
			t.Errorf("%s: temporary files left: %v", c.name, files)
		}
	}
}
