package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spill-ml/spill/offload"
)

// planUpdate rewrites the golden files: go test ./cmd/spill -run Plan -update
var planUpdate = lookupOrDefineBool("update", "rewrite golden files in testdata")

// lookupOrDefineBool shares a test flag with other files of the package
// that may define it too.
func lookupOrDefineBool(name, usage string) func() bool {
	if f := flag.Lookup(name); f != nil {
		return func() bool { return f.Value.String() == "true" }
	}
	p := flag.Bool(name, false, usage)
	return func() bool { return *p }
}

func TestPlanGolden(t *testing.T) {
	disk := t.TempDir()
	cases := []struct {
		name string
		args []string
	}{
		{"gpt2-roomy", []string{"--model", "gpt2", "--seq-len", "1024", "--batch", "8", "--device-memory", "80GiB", "--host-memory", "64GiB",
			"--disk-dir", disk, "--disk-memory", "60GiB"}},
		{"gpt2-1.3b-8g", []string{"--model", "gpt2-1.3b", "--seq-len", "1024", "--batch", "8", "--accum", "8",
			"--device-memory", "8GiB", "--host-memory", "110GiB", "--disk-dir", disk, "--disk-memory", "60GiB"}},
		{"gpt2-1.3b-16g", []string{"--model", "gpt2-1.3b", "--seq-len", "1024", "--batch", "16", "--device-memory", "16GiB",
			"--host-memory", "100GiB", "--disk-dir", disk, "--disk-memory", "60GiB"}},
		{"gpt2-13b-disk", []string{"--model", "gpt2-13b", "--seq-len", "1024", "--batch", "8", "--device-memory", "40GiB",
			"--host-memory", "120GiB", "--disk-dir", disk, "--disk-memory", "1TiB"}},
		// 64 GiB of host: only with the disk layers' master weights on
		// disk too.
		{"gpt2-13b-disk-master", []string{"--model", "gpt2-13b", "--seq-len", "1024", "--batch", "8", "--device-memory", "40GiB",
			"--host-memory", "64GiB", "--disk-dir", disk, "--disk-memory", "1TiB"}},
		{"gpt2-13b-host-short-infeasible", []string{"--model", "gpt2-13b", "--seq-len", "1024", "--batch", "8", "--device-memory", "40GiB",
			"--host-memory", "48GiB", "--disk-dir", disk, "--disk-memory", "1TiB"}},
		{"custom-fp32-json", []string{"--layers", "4", "--embd", "256", "--heads", "4", "--vocab", "1000", "--max-seq", "128",
			"--model", "gpt2-124m", "--seq-len", "128", "--batch", "4", "--precision", "fp32", "--device-memory", "3GiB",
			"--host-memory", "8GiB", "--disk-memory", "1GiB", "--disk-dir", disk, "--json"}},
		{"gpt2-70b-infeasible", []string{"--model", "gpt2-70b", "--batch", "4", "--device-memory", "8GiB", "--host-memory", "16GiB",
			"--disk-dir", disk, "--disk-memory", "100GiB"}},
		// One rank of 8 on a node of 2 TiB, as spill train runs it (the
		// optimizer state not sharded): per-rank budgets and peaks, the
		// gradients' all-reduce.
		{"gpt2-13b-8ranks", []string{"--model", "gpt2-13b", "--seq-len", "1024", "--batch", "8", "--nproc-per-node", "8",
			"--device-memory", "40GiB", "--host-memory", "2TiB", "--disk-dir", disk, "--disk-memory", "1TiB"}},
		// 1 TiB for 8 ranks is short of every rank's whole optimizer
		// state: the planner shards it and says why.
		{"llama2-13b-8ranks-shard-json", []string{"--model", "llama2-13b", "--seq-len", "2048", "--batch", "4", "--accum", "4",
			"--nproc-per-node", "8", "--shard-optimizer", "auto", "--device-memory", "40GiB", "--host-memory", "1TiB",
			"--disk-dir", disk, "--disk-memory", "1TiB", "--json"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := runMain(context.Background(), append([]string{"plan"}, c.args...), &out, &errb)
			got := strings.ReplaceAll(out.String()+errb.String(), disk, "DISK")
			if strings.HasSuffix(c.name, "infeasible") {
				if code != exitFailure {
					t.Fatalf("exit %d, want %d: %s", code, exitFailure, got)
				}
			} else if code != exitOK {
				t.Fatalf("exit %d: %s", code, got)
			}
			golden := filepath.Join("testdata", "plan", c.name+".golden")
			if planUpdate() {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Fatalf("output differs from %s (run with -update if intended):\n--- got\n%s\n--- want\n%s", golden, got, want)
			}
		})
	}
}

// TestPlanRanksRefusals: several ranks on the cpu device, and bad rank
// flags, are refused.
func TestPlanRanksRefusals(t *testing.T) {
	for _, args := range [][]string{
		{"--device", "cpu", "--nproc-per-node", "2"},
		{"--nproc-per-node", "2", "--shard-optimizer", "maybe"},
		{"--nproc-per-node", "-1"},
	} {
		var out, errb bytes.Buffer
		if code := runMain(context.Background(), append([]string{"plan"}, args...), &out, &errb); code == exitOK {
			t.Errorf("spill plan %v: exit 0: %s", args, out.String())
		}
	}
}

// TestPlanIsWhatTrainRuns: spill plan --json prints, byte for byte, the
// plan spill train runs with the same flags (--plan-json), out of core and
// resident.
func TestPlanIsWhatTrainRuns(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"out-of-core", []string{"--device-memory", "4MiB", "--accum", "3"}},
		{"layer-major", []string{"--device-memory", "3MiB", "--accum", "3"}},
		{"resident", []string{"--device-memory", "64MiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags := append([]string{"--device", "cpu", "--threads", "2", "--host-memory", "1GiB", "--disk-dir", dir,
				"--disk-memory", "1GiB", "--eval-every", "0"}, tc.flags...)
			var out, errb bytes.Buffer
			if code := runMain(context.Background(), append(append([]string{"plan"}, flags...), "--json"), &out, &errb); code != exitOK {
				t.Fatalf("plan: exit %d: %s", code, errb.String())
			}
			planned := out.String()
			path := filepath.Join(dir, tc.name+".json")
			out.Reset()
			errb.Reset()
			args := append(append([]string{"train"}, flags...), "--steps", "1", "--quiet", "--plan-json", path)
			if code := runMain(context.Background(), args, &out, &errb); code != exitOK {
				t.Fatalf("train: exit %d: %s", code, errb.String())
			}
			ran, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(ran) != planned {
				t.Fatalf("spill plan printed\n%s\nspill train ran\n%s", planned, ran)
			}
			if tc.name != "resident" && !strings.Contains(planned, `"optimizer": "host"`) {
				t.Errorf("%s: the plan is not out of core:\n%s", tc.name, planned)
			}
			if tc.name == "layer-major" && strings.Contains(planned, `"group": 1,`) {
				t.Errorf("the plan is not layer-major:\n%s", planned)
			}
		})
	}
}

func TestPlanJSONAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	code := runMain(context.Background(), []string{"plan", "--model", "gpt2-medium", "--seq-len", "1024", "--batch", "4",
		"--device-memory", "8GiB", "--host-memory", "32GiB", "--json"}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var p offload.Placement
	if err := json.Unmarshal(out.Bytes(), &p); err != nil {
		t.Fatalf("--json output does not parse: %v", err)
	}
	if p.Model != "gpt2-350m" || p.MicroBatch*p.Accum != 4 || len(p.Memory) != 3 || p.Memory[0].Peak > 8<<30 {
		t.Fatalf("plan %+v", p)
	}
	for _, args := range [][]string{
		{"plan", "--model", "nope"},
		{"plan", "--model", "gpt2", "--device-memory", "lots"},
		{"plan", "--model", "gpt2", "--precision", "int4"},
		{"plan", "--model", "gpt2", "extra"},
	} {
		errb.Reset()
		if code := runMain(context.Background(), args, &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitUsage, errb.String())
		}
	}
}

// TestPlanLlama: a Llama 3.1 8B at T 2048 is planned under a 24 GiB
// device: the plan has the model's published size, its 32 decoder layers
// and head, and a device peak within the budget.
func TestPlanLlama(t *testing.T) {
	disk := t.TempDir()
	args := []string{"plan", "--model", "llama3.1-8b", "--seq-len", "2048", "--batch", "1", "--accum", "8",
		"--device-memory", "24GiB", "--device", "cpu", "--threads", "2", "--host-memory", "100GiB",
		"--disk-dir", disk, "--disk-memory", "200GiB"}
	var out, errb bytes.Buffer
	if code := runMain(context.Background(), args, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	text := out.String()
	for _, want := range []string{"llama3.1-8b, 8.03 B params", "seq 2048", "embed_tokens", "layers.31", "head", "budget                    24.0 GiB"} {
		if !strings.Contains(text, want) {
			t.Errorf("plan lacks %q:\n%s", want, text)
		}
	}
	out.Reset()
	if code := runMain(context.Background(), append(args, "--json"), &out, &errb); code != exitOK {
		t.Fatalf("--json: exit %d: %s", code, errb.String())
	}
	var p offload.Placement
	if err := json.Unmarshal(out.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Model != "llama3.1-8b" || len(p.Layers) != 34 || p.Memory[0].Peak > 24<<30 || p.Memory[0].Peak < 1<<30 {
		t.Errorf("plan: model %s, %d layers, device peak %d", p.Model, len(p.Layers), p.Memory[0].Peak)
	}
}

// spill plan --init-from with no --data plans the checkpoint's shape for
// token sequences (it fell back to the embedded dataset, whose vocabulary
// did not match).
func TestPlanInitFromNoData(t *testing.T) {
	var out, errb bytes.Buffer
	code := runMain(context.Background(), []string{"plan", "--init-from", filepath.Join("..", "..", "engine", "testdata", "hf-tiny-llama"),
		"--device", "cpu", "--device-memory", "1MiB"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "seq 64") || !strings.Contains(out.String(), "placement") {
		t.Errorf("plan output:\n%s", out.String())
	}
}
