package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReportFromRealRun trains a few steps with metrics and a trace, writes
// a plan, renders the report and checks the files: one PNG per plot the
// fields allow, and an index.html that inlines every one of them.
func TestReportFromRealRun(t *testing.T) {
	dir := t.TempDir()
	metrics, trace, plan := filepath.Join(dir, "run.jsonl"), filepath.Join(dir, "trace.json"), filepath.Join(dir, "plan.json")
	code, _, stderr := run(t, context.Background(), "train", "--layers", "1", "--heads", "2", "--embd", "32", "--max-seq", "32",
		"--steps", "6", "--batch", "4", "--eval-every", "3", "--eval-batches", "1", "--threads", "2", "--quiet",
		"--device-memory", "64MiB", "--metrics", metrics, "--trace", trace)
	if code != exitOK {
		t.Fatalf("train: exit %d: %s", code, stderr)
	}
	var planOut bytes.Buffer
	if code := runMain(context.Background(), []string{"plan", "--model", "gpt2-124m", "--device-memory", "8GiB", "--json"}, &planOut, &bytes.Buffer{}); code != exitOK {
		t.Fatalf("plan: exit %d", code)
	}
	os.WriteFile(plan, planOut.Bytes(), 0o644)

	out := filepath.Join(dir, "report")
	code, stdout, stderr := run(t, context.Background(), "report", metrics, "--trace", trace, "--plan", plan, "--out", out)
	if code != exitOK || !strings.Contains(stdout, "index.html (6 plots from 6 steps)") {
		t.Fatalf("report: exit %d\n%s%s", code, stdout, stderr)
	}
	// No out-of-core transfer counters in a resident CPU run.
	if !strings.Contains(stdout, "not drawn: bytes moved between tiers") {
		t.Errorf("stdout does not list the missing transfer plot:\n%s", stdout)
	}
	html, err := os.ReadFile(filepath.Join(out, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"loss", "loss_tokens", "throughput", "tflops", "memory", "time"} {
		png, err := os.ReadFile(filepath.Join(out, name+".png"))
		if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 5000 {
			t.Errorf("%s.png: %d bytes, %v", name, len(png), err)
		}
		if !bytes.Contains(html, []byte(`id="`+name+`"`)) {
			t.Errorf("index.html has no figure %s", name)
		}
	}
	if n := bytes.Count(html, []byte(`src="data:image/png;base64,`)); n != 6 || bytes.Contains(html, []byte(`src="http`)) {
		t.Errorf("index.html inlines %d images (want 6, and no external ones)", n)
	}
	for _, want := range []string{"Trace: busy time by track", "eval loss", "plan.json", "Not drawn"} {
		if !bytes.Contains(html, []byte(want)) {
			t.Errorf("index.html lacks %q", want)
		}
	}
	// A metrics file from an older run, without the newer fields, still
	// renders what it can; a broken line is named.
	old := filepath.Join(dir, "old.jsonl")
	os.WriteFile(old, []byte(`{"step":1,"loss":5.5,"tokens_per_sec":100,"peak_device_bytes":1000,"elapsed_ns":1}`+"\n"+
		`{"step":2,"loss":5.0,"tokens_per_sec":120,"peak_device_bytes":1000,"elapsed_ns":2}`+"\n"), 0o644)
	if code, stdout, _ := run(t, context.Background(), "report", old, "--out", filepath.Join(dir, "old")); code != exitOK || !strings.Contains(stdout, "(3 plots from 2 steps)") {
		t.Errorf("old metrics: exit %d\n%s", code, stdout)
	}
	os.WriteFile(old, []byte(`{"step":1,"loss":5.5}`+"\nnot json\n"), 0o644)
	if code, _, stderr := run(t, context.Background(), "report", old, "--out", filepath.Join(dir, "bad")); code != exitFailure || !strings.Contains(stderr, "old.jsonl:2:") {
		t.Errorf("broken line: exit %d: %s", code, stderr)
	}
}
