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
	cases := []struct {
		name string
		args []string
	}{
		{"gpt2-roomy", []string{"--model", "gpt2", "--batch", "8", "--device-mem", "80GiB", "--host-mem", "64GiB"}},
		{"gpt2-1.3b-16g", []string{"--model", "gpt2-1.3b", "--batch", "16", "--device-mem", "16GiB", "--host-mem", "100GiB"}},
		{"gpt2-13b-disk", []string{"--model", "gpt2-13b", "--batch", "8", "--device-mem", "40GiB", "--host-mem", "64GiB", "--disk", "1TiB"}},
		{"custom-fp32-json", []string{"--layers", "4", "--embd", "256", "--heads", "4", "--vocab", "1000", "--seq-len", "128",
			"--batch", "4", "--precision", "fp32", "--device-mem", "3GiB", "--host-mem", "8GiB", "--json"}},
		{"gpt2-70b-infeasible", []string{"--model", "gpt2-70b", "--batch", "4", "--device-mem", "8GiB", "--host-mem", "16GiB"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := runMain(context.Background(), append([]string{"plan"}, c.args...), &out, &errb)
			got := out.String() + errb.String()
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

func TestPlanJSONAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	code := runMain(context.Background(), []string{"plan", "--model", "gpt2-medium", "--batch", "4",
		"--device-mem", "8GiB", "--host-mem", "32GiB", "--json"}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var p offload.Placement
	if err := json.Unmarshal(out.Bytes(), &p); err != nil {
		t.Fatalf("--json output does not parse: %v", err)
	}
	if p.Model != "gpt2-medium" || p.MicroBatch*p.Accum != 4 || len(p.Memory) != 3 || p.Memory[0].Peak > 8<<30 {
		t.Fatalf("plan %+v", p)
	}
	for _, args := range [][]string{
		{"plan", "--model", "nope"},
		{"plan", "--layers", "4"},
		{"plan", "--model", "gpt2", "--device-mem", "lots"},
		{"plan", "--model", "gpt2", "--precision", "int4"},
		{"plan", "--model", "gpt2", "extra"},
	} {
		errb.Reset()
		if code := runMain(context.Background(), args, &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitUsage, errb.String())
		}
	}
}
