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

type offloadMetrics struct {
	Step      int   `json:"step"`
	Peak      int64 `json:"peak_device_bytes"`
	Predicted int64 `json:"predicted_device_peak"`
	Measured  int64 `json:"measured_device_peak"`
}

func readOffloadMetrics(t *testing.T, path string) []offloadMetrics {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []offloadMetrics
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m offloadMetrics
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, m)
	}
	return out
}

// TestTrainAutoOffloadUnderBudget: the default tiny run with a device
// budget of 1/8 of what its resident state needs trains out of core as
// planned (the backend's peak within the budget, the predicted device peak
// never below the measured one and within 15% of it), and with --offload
// none the same budget is a typed error naming the classes held, the plan
// that would fit and the memory summary, printed once.
func TestTrainAutoOffloadUnderBudget(t *testing.T) {
	dir := t.TempDir()
	base := []string{"train", "--eval-every", "0", "--quiet", "--threads", "2"}
	resident := filepath.Join(dir, "resident.jsonl")
	if code := runMain(context.Background(), append(base, "--steps", "1", "--metrics", resident), &bytes.Buffer{}, &bytes.Buffer{}); code != exitOK {
		t.Fatalf("resident run: exit %d", code)
	}
	rm := readOffloadMetrics(t, resident)
	if len(rm) != 1 || rm[0].Peak <= 0 {
		t.Fatalf("resident metrics %+v", rm)
	}
	budget := rm[0].Peak / 8
	arg := strconv.FormatInt(budget, 10)

	metrics := filepath.Join(dir, "ooc.jsonl")
	var out, errb bytes.Buffer
	code := runMain(context.Background(), append(base, "--steps", "2", "--device-memory", arg, "--metrics", metrics, "--memory-report"), &out, &errb)
	if code != exitOK {
		t.Fatalf("budget %d: exit %d\n%s%s", budget, code, out.String(), errb.String())
	}
	ms := readOffloadMetrics(t, metrics)
	if len(ms) != 2 {
		t.Fatalf("%d metric lines, want 2", len(ms))
	}
	for _, m := range ms {
		if m.Peak > budget {
			t.Errorf("step %d: backend peak %d above the budget %d", m.Step, m.Peak, budget)
		}
		if m.Predicted < m.Measured || float64(m.Predicted) > 1.15*float64(m.Measured) || m.Measured <= 0 {
			t.Errorf("step %d: predicted device peak %d, measured %d", m.Step, m.Predicted, m.Measured)
		}
	}
	for _, want := range []string{"out of core", "memory summary", "plan versus measured"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	errb.Reset()
	code = runMain(context.Background(), append(base, "--steps", "1", "--device-memory", arg, "--offload", "none"), &out, &errb)
	msg := errb.String()
	if code != exitFailure {
		t.Fatalf("--offload none: exit %d, want %d\n%s", code, exitFailure, msg)
	}
	for _, want := range []string{"device budget exceeded", "weights", "adam_m", "a plan that fits", "memory summary"} {
		if !strings.Contains(msg, want) {
			t.Errorf("--offload none error lacks %q:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "memory summary"); n != 1 {
		t.Errorf("memory summary printed %d times:\n%s", n, msg)
	}
}

// TestPlanSharesTrainNamesAndFlags: spill plan takes spill train's model
// names (and their aliases) and flags.
func TestPlanSharesTrainNamesAndFlags(t *testing.T) {
	run := func(args ...string) string {
		var out, errb bytes.Buffer
		if code := runMain(context.Background(), append([]string{"plan"}, args...), &out, &errb); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	disk := []string{"--disk-dir", t.TempDir(), "--disk-memory", "10GiB"}
	alias := run(append([]string{"--model", "gpt2-medium", "--seq-len", "1024", "--batch", "4", "--device-memory", "8GiB", "--host-memory", "32GiB"}, disk...)...)
	cur := run(append([]string{"--model", "gpt2-350m", "--seq-len", "1024", "--batch", "4", "--device-memory", "8GiB", "--host-memory", "32GiB"}, disk...)...)
	if alias != cur || !strings.Contains(cur, "gpt2-350m") {
		t.Errorf("gpt2-350m differs from its alias gpt2-medium:\n%s\n---\n%s", cur, alias)
	}
	cfg, _, err := parseTrainArgs([]string{"--model", "gpt2-medium", "--device-memory", "1GiB", "--offload-weights", "host",
		"--prefetch", "2", "--activations", "recompute", "--host-memory", "4GiB", "--disk-dir", t.TempDir(), "--disk-memory", "2GiB"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Model != "gpt2-350m" || cfg.OffloadWeights != "host" || cfg.Prefetch != 2 || cfg.Activations != "recompute" ||
		cfg.HostMemory != 4<<30 || cfg.DiskMemory != 2<<30 {
		t.Errorf("flags: %+v", cfg)
	}
}
