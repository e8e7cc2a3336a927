package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spill-ml/spill/engine"
)

// buildSpill compiles this command into dir and returns the binary's path.
func buildSpill(t *testing.T, dir string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, "spill")
	cmd := exec.Command(goBin, "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestTrainKillAndResume is the resume contract on the real binary: a run
// killed with SIGKILL after a mid-run checkpoint and resumed with --resume
// ends with the same weights, bit for bit, as a run that was never
// interrupted, and reports the same loss at every step.
func TestTrainKillAndResume(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the spill binary three times")
	}
	tmp := t.TempDir()
	bin := buildSpill(t, tmp)
	data, err := engine.DefaultDataset(context.Background(), filepath.Join(tmp, "data"))
	if err != nil {
		t.Fatal(err)
	}
	const N = 24
	common := []string{"train", "--data", data, "--layers", "1", "--heads", "2", "--embd", "32", "--max-seq", "32",
		"--seq-len", "16", "--batch", "4", "--steps", strconv.Itoa(N), "--eval-every", "6", "--eval-batches", "2",
		"--threads", "1", "--quiet", "--keep-checkpoints", "1000"}
	args := func(ckpt, metrics string, extra ...string) []string {
		a := append(append([]string(nil), common...), "--checkpoint-dir", ckpt, "--metrics", metrics)
		return append(a, extra...)
	}
	run := func(a []string) {
		t.Helper()
		out, err := exec.Command(bin, a...).CombinedOutput()
		if err != nil {
			t.Fatalf("spill %s: %v\n%s", strings.Join(a, " "), err, out)
		}
	}

	// 1. Straight through.
	ckA, mA := filepath.Join(tmp, "ckA"), filepath.Join(tmp, "a.jsonl")
	run(args(ckA, mA))

	// 2. Checkpoint every step, SIGKILL once a checkpoint at step >= N/2
	// exists. A run this small can finish between two polls on a loaded
	// machine: then it is started again, from nothing.
	ckB, mB := filepath.Join(tmp, "ckB"), filepath.Join(tmp, "b.jsonl")
	killedAt := -1
	for attempt := 1; killedAt < 0; attempt++ {
		for _, p := range []string{ckB, mB} {
			if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
		}
		var out string
		var exited error
		killedAt, out, exited = killAfterCheckpoint(t, bin, args(ckB, mB, "--checkpoint-every", "1"), ckB, N/2)
		if killedAt < 0 && attempt == 5 {
			t.Fatalf("run exited (%v) before a checkpoint at step >= %d was seen, %d times; last output:\n%s", exited, N/2, attempt, out)
		}
	}
	latest, _ := engine.LatestCheckpoint(ckB)
	if latest == engine.CheckpointPath(ckB, N) {
		t.Fatalf("the run reached step %d before it was killed: the test did not exercise resume", N)
	}
	t.Logf("killed after the checkpoint of step %d; resuming from %s", killedAt, latest)

	// 3. Resume to N.
	run(args(ckB, mB, "--checkpoint-every", "1", "--resume"))

	// The final weights are bitwise identical.
	wa, _, err := engine.ReadSafetensors(filepath.Join(engine.CheckpointPath(ckA, N), engine.CheckpointModelFile))
	if err != nil {
		t.Fatal(err)
	}
	wb, _, err := engine.ReadSafetensors(filepath.Join(engine.CheckpointPath(ckB, N), engine.CheckpointModelFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(wa) != len(wb) || len(wa) == 0 {
		t.Fatalf("%d vs %d tensors", len(wa), len(wb))
	}
	for i := range wa {
		if wa[i].Name != wb[i].Name || !bytes.Equal(wa[i].Data, wb[i].Data) {
			t.Errorf("tensor %s differs between the straight and the resumed run", wa[i].Name)
		}
	}

	// Every step's loss (and lr, grad norm, eval loss) is identical; the
	// killed-and-resumed metrics file holds every step once, in order (the
	// resume cut the lines the killed run wrote after its checkpoint).
	ma, err := engine.ReadMetricsJSONL(mA)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := engine.ReadMetricsJSONL(mB)
	if err != nil {
		t.Fatal(err)
	}
	if len(ma) != N {
		t.Fatalf("straight run reported %d steps, want %d", len(ma), N)
	}
	seen := map[int]bool{}
	for i, m := range mb {
		if m.Step != i+1 {
			t.Fatalf("resumed metrics line %d is step %d", i+1, m.Step)
		}
		if m.Step < 1 || m.Step > N {
			t.Fatalf("resumed run reported step %d", m.Step)
		}
		ref := ma[m.Step-1]
		same := func(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }
		if !same(m.Loss, ref.Loss) || !same(m.LR, ref.LR) || !same(m.GradNorm, ref.GradNorm) || fmt.Sprint(m.EvalLoss != nil) != fmt.Sprint(ref.EvalLoss != nil) ||
			(m.EvalLoss != nil && !same(*m.EvalLoss, *ref.EvalLoss)) {
			t.Errorf("step %d: resumed %+v, straight %+v", m.Step, m, ref)
		}
		seen[m.Step] = true
	}
	if len(seen) != N {
		t.Errorf("resumed metrics cover %d of %d steps", len(seen), N)
	}
	// Resuming under different math is refused, naming the field; raising
	// --steps is allowed.
	out, err := exec.Command(bin, args(ckA, mA+".2", "--resume", "--lr", "0.5")...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "lr") {
		t.Errorf("resume with another lr: %v\n%s", err, out)
	}
	// The warmup default (steps/20) is 1 at N = 24 and 2 at 40: the
	// extended run keeps the checkpoint's.
	run(args(ckA, mA+".3", "--resume", "--steps", "40"))
	if p, _ := engine.LatestCheckpoint(ckA); p != engine.CheckpointPath(ckA, 40) {
		t.Errorf("extended run's latest checkpoint is %s", p)
	}
	// A newest checkpoint with a file missing is skipped with a warning;
	// --resume-from picks one.
	os.Remove(filepath.Join(engine.CheckpointPath(ckB, N), engine.CheckpointOptimFile))
	out, err = exec.Command(bin, args(ckB, mB, "--resume", "--steps", strconv.Itoa(N), "--checkpoint-every", "100")...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "warning: skipping an incomplete checkpoint: checkpoint "+engine.CheckpointPath(ckB, N)) ||
		!strings.Contains(string(out), engine.CheckpointOptimFile) {
		t.Errorf("resume past an incomplete checkpoint: %v\n%s", err, out)
	}
	from := engine.CheckpointPath(ckB, N/2)
	run(append(args(ckB, mB, "--steps", strconv.Itoa(N)), "--resume-from", from))
	if mb, err = engine.ReadMetricsJSONL(mB); err != nil || len(mb) != N || mb[N-1].Loss != ma[N-1].Loss {
		t.Errorf("--resume-from %s: %d metrics lines, %v", from, len(mb), err)
	}
	// Ctrl-C: the run saves a checkpoint, prints its summary and exits 130.
	ckC, mC := filepath.Join(tmp, "ckC"), filepath.Join(tmp, "c.jsonl")
	cmd := exec.Command(bin, args(ckC, mC, "--checkpoint-every", "1000")...)
	var outC bytes.Buffer
	cmd.Stdout, cmd.Stderr = &outC, &outC
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(mC); bytes.Count(b, []byte("\n")) >= 2 {
			break
		}
	}
	cmd.Process.Signal(os.Interrupt)
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != exitInterrupted || !strings.Contains(outC.String(), "interrupted at step") {
		t.Errorf("after SIGINT: exit %d (%v)\n%s", code, err, outC.String())
	}
	if p, _ := engine.LatestCheckpoint(ckC); p == "" {
		t.Errorf("no checkpoint saved on SIGINT:\n%s", outC.String())
	}
	if first, last := ma[0].Loss, ma[N-1].Loss; !(last < first) {
		t.Errorf("loss did not fall: %v -> %v", first, last)
	}
}

// killAfterCheckpoint starts spill with args and kills it (SIGKILL) once
// ckDir holds a checkpoint at step >= atLeast: it returns that step, or -1
// with the run's output and exit status if the run ended first.
func killAfterCheckpoint(t *testing.T, bin string, args []string, ckDir string, atLeast int) (int, string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return -1, out.String(), err
		default:
		}
		if p, _ := engine.LatestCheckpoint(ckDir); p != "" {
			if step, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(p), "step-")); step >= atLeast {
				cmd.Process.Kill() // SIGKILL: no chance to save anything
				<-done
				return step, out.String(), nil
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	cmd.Process.Kill()
	<-done
	t.Fatalf("no checkpoint at step >= %d within the deadline; output:\n%s", atLeast, out.String())
	return -1, "", nil
}
