// Package report renders a training run as one self-contained HTML page
// with PNG plots (gonum.org/v1/plot): loss and eval loss against steps and
// tokens, throughput and model TFLOP/s, device and host memory against the
// plan, the per-step time split and the bytes moved between tiers.
//
// It reads the metrics JSONL of spill train (one object per step) by field
// name and draws whatever fields are there, so lines written by older or
// newer spills (with or without the trace breakdown, transfer counters or
// host memory) all render; a plot whose fields are absent is listed as
// missing with the flag that would record them.
package report

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// Run is what a report is drawn from.
type Run struct {
	// Metrics is the metrics file's path; Steps its lines by ascending
	// step (a step written twice, as by a resumed run before spill cut
	// the file back, keeps its last line). Each maps a field to its value:
	// numbers as they are, booleans 0 or 1, null NaN.
	Metrics string
	Steps   []Step
	// Plan is the JSON of spill plan --json, nil when not given.
	Plan map[string]any
	// Trace sums the Chrome trace's spans by track (nil when not given).
	Trace []TrackTime
	// TracePath and PlanPath are the files read ("" when not given).
	TracePath, PlanPath string
}

// Step is one metrics line.
type Step map[string]float64

// Get returns field k and whether it is present and finite.
func (s Step) Get(k string) (float64, bool) {
	v, ok := s[k]
	return v, ok && !math.IsNaN(v) && !math.IsInf(v, 0)
}

// TrackTime is the busy time of one track of a trace.
type TrackTime struct {
	Track   string
	Seconds float64
	Spans   int
}

// Load reads a run: the metrics JSONL (required), the Chrome trace and the
// plan JSON (each optional: "" skips it). Errors name the file and line.
func Load(metrics, trace, plan string) (*Run, error) {
	r := &Run{Metrics: metrics, TracePath: trace, PlanPath: plan}
	f, err := os.Open(metrics)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	defer f.Close()
	byStep := map[float64]Step{}
	br := bufio.NewReader(f)
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if err == io.EOF {
			// A last line without its newline was cut by a kill: skip it
			// unless it parses.
			if len(b) > 0 {
				if s, perr := parseLine(b); perr == nil {
					byStep[s["step"]] = s
				}
			}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("report: %s: %w", metrics, err)
		}
		if len(b) <= 1 {
			continue
		}
		s, err := parseLine(b)
		if err != nil {
			return nil, fmt.Errorf("report: %s:%d: %w", metrics, line, err)
		}
		byStep[s["step"]] = s
	}
	if len(byStep) == 0 {
		return nil, fmt.Errorf("report: %s holds no metrics lines (write them with spill train --metrics FILE)", metrics)
	}
	for _, s := range byStep {
		r.Steps = append(r.Steps, s)
	}
	sort.Slice(r.Steps, func(i, j int) bool { return r.Steps[i]["step"] < r.Steps[j]["step"] })
	if plan != "" {
		data, err := os.ReadFile(plan)
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		if err := json.Unmarshal(data, &r.Plan); err != nil {
			return nil, fmt.Errorf("report: plan %s: %v (want the output of spill plan --json)", plan, err)
		}
	}
	if trace != "" {
		if r.Trace, err = loadTrace(trace); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func parseLine(b []byte) (Step, error) {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	s := Step{}
	for k, v := range raw {
		switch x := v.(type) {
		case float64:
			s[k] = x
		case bool:
			s[k] = 0
			if x {
				s[k] = 1
			}
		case nil:
			s[k] = math.NaN()
		}
	}
	if _, ok := s.Get("step"); !ok {
		return nil, errors.New(`no "step" field`)
	}
	return s, nil
}

// loadTrace sums the complete ("X") events of a Chrome trace by track
// (thread name).
func loadTrace(path string) ([]TrackTime, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	defer f.Close()
	var doc struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Tid  int            `json:"tid"`
			Dur  float64        `json:"dur"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.NewDecoder(bufio.NewReader(f)).Decode(&doc); err != nil {
		return nil, fmt.Errorf("report: trace %s: %v (want the Chrome trace JSON of spill train --trace)", path, err)
	}
	names := map[int]string{}
	sums := map[int]*TrackTime{}
	for _, e := range doc.TraceEvents {
		switch e.Ph {
		case "M":
			if e.Name == "thread_name" {
				if n, ok := e.Args["name"].(string); ok {
					names[e.Tid] = n
				}
			}
		case "X":
			t := sums[e.Tid]
			if t == nil {
				t = &TrackTime{}
				sums[e.Tid] = t
			}
			t.Seconds += e.Dur / 1e6
			t.Spans++
		}
	}
	var out []TrackTime
	for tid, t := range sums {
		t.Track = names[tid]
		if t.Track == "" {
			t.Track = fmt.Sprintf("track %d", tid)
		}
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seconds > out[j].Seconds })
	return out, nil
}
