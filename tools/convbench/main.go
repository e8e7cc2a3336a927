// Command convbench times `spill convert --compress none` of a nanoGPT-style token file
// against `cp` of the same file and records the peak RSS of the conversion.
//
// It generates a file of random uint16 tokens (--size, default 4 GiB) in --dir, then
// --runs times (default 3) runs cp, cp followed by an fsync of the copy (since convert
// fsyncs its shards) and spill convert, one after the other, and writes a JSON report
// (date, machine, load average, commands, median and all times, ratios of the medians,
// peak RSS) to --json. Generated files are deleted at the end. If the disk lacks room
// for the input, the copy and the dataset, it says so and exits 0 without measuring.
// On a shared machine run it when the load average is low; it is recorded.
//
// Run from the repository root:
//
//	go run ./tools/convbench --size 4GiB
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spill-ml/spill/kernels"
)

type run struct {
	Command   string    `json:"command"`
	Seconds   float64   `json:"seconds"` // median of Runs
	Runs      []float64 `json:"runs_seconds,omitempty"`
	PeakRSSMB float64   `json:"peak_rss_mib"` // largest over the runs
}

type report struct {
	Bench         string  `json:"bench_command"`
	Date          string  `json:"date"`
	Machine       machine `json:"machine"`
	InputBytes    int64   `json:"input_bytes"`
	LoadBefore    string  `json:"loadavg_before"` // /proc/loadavg: 1, 5, 15 minutes
	LoadAfter     string  `json:"loadavg_after"`
	Cp            run     `json:"cp"`
	CpSync        run     `json:"cp_fsync"`
	Convert       run     `json:"convert"`
	RatioVsCp     float64 `json:"ratio_vs_cp"`       // convert seconds / cp seconds
	RatioVsCpSync float64 `json:"ratio_vs_cp_fsync"` // convert seconds / (cp + fsync) seconds
	TargetRatio   float64 `json:"target_ratio"`
	TargetRSSMiB  float64 `json:"target_rss_mib"`
	MeetsRatio    bool    `json:"meets_ratio"`
	MeetsRSS      bool    `json:"meets_rss"`
	ConvertMiBps  float64 `json:"convert_mib_per_s"`
	Note          string  `json:"note"`
}

type machine struct {
	NProc int    `json:"nproc"`
	CPU   string `json:"cpu"`
	OS    string `json:"os"`
	MemGB int64  `json:"mem_gib"`
}

func main() {
	size := flag.String("size", "4GiB", "size of the generated token file (suffix MiB or GiB)")
	dir := flag.String("dir", os.TempDir(), "scratch directory for the generated files (outside the repository)")
	spill := flag.String("spill", "", "spill binary (default: go build ./cmd/spill into the scratch directory)")
	out := flag.String("json", "tools/bench/results/convert.json", "where to write the report")
	runs := flag.Int("runs", 3, "measurements of each command (the median is reported)")
	flag.Parse()
	if *runs < 1 {
		fmt.Fprintln(os.Stderr, "convbench: --runs must be at least 1")
		os.Exit(2)
	}
	if err := bench(*size, *dir, *spill, *out, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "convbench:", err)
		os.Exit(1)
	}
}

func bench(sizeFlag, dir, spill, out string, runs int) error {
	n, err := kernels.ParseBytes(sizeFlag)
	if err != nil {
		return err
	}
	n &^= 1 // whole uint16 tokens
	work, err := os.MkdirTemp(dir, "convbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var st syscall.Statfs_t
	if err := syscall.Statfs(work, &st); err != nil {
		return err
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free < 3*n+(1<<30) {
		fmt.Printf("convbench: skipped: %s has %d MiB free, need %d MiB (input, copy and dataset)\n", work, free>>20, (3*n+(1<<30))>>20)
		return nil
	}
	if spill == "" {
		spill = filepath.Join(work, "spill")
		b := exec.Command("go", "build", "-o", spill, "./cmd/spill")
		b.Stdout, b.Stderr = os.Stdout, os.Stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("build spill: %w", err)
		}
	}
	in := filepath.Join(work, "train.bin")
	fmt.Printf("convbench: generating %d MiB of tokens in %s\n", n>>20, in)
	if err := generate(in, n); err != nil {
		return err
	}

	rep := report{Bench: fmt.Sprintf("go run ./tools/convbench --size %s --runs %d", sizeFlag, runs), Date: time.Now().UTC().Format(time.RFC3339),
		Machine: describeMachine(), InputBytes: n, TargetRatio: 2, TargetRSSMiB: 256}
	cpDst := filepath.Join(work, "copy.bin")
	ds := filepath.Join(work, "ds")
	// Warm the page cache for both contenders alike: cp reads the input once first.
	if _, err := timed("cp", in, cpDst); err != nil {
		return err
	}
	if err := cleanup(cpDst); err != nil {
		return err
	}
	rep.LoadBefore = loadavg()
	for range runs {
		// Each command starts with no dirty pages of the previous one (cleanup syncs).
		if err := measure(&rep.Cp, cpDst, "cp", in, cpDst); err != nil {
			return err
		}
		if err := measure(&rep.CpSync, cpDst, "sh", "-c", fmt.Sprintf("cp %s %s && sync %s", in, cpDst, cpDst)); err != nil {
			return err
		}
		if err := measure(&rep.Convert, ds, spill, "convert", "--quiet", "--compress", "none", "--out", ds, in); err != nil {
			return err
		}
	}
	rep.LoadAfter = loadavg()
	rep.RatioVsCp = rep.Convert.Seconds / rep.Cp.Seconds
	rep.RatioVsCpSync = rep.Convert.Seconds / rep.CpSync.Seconds
	rep.MeetsRatio = rep.RatioVsCp <= rep.TargetRatio
	rep.MeetsRSS = rep.Convert.PeakRSSMB <= rep.TargetRSSMiB
	rep.ConvertMiBps = float64(n) / (1 << 20) / rep.Convert.Seconds
	rep.Note = "input in the page cache for all runs; convert fsyncs every shard, plain cp does not (cp_fsync adds sync of the copy); seconds are medians of the runs, interleaved; peak RSS from wait4 rusage"
	for _, r := range []run{rep.Cp, rep.CpSync, rep.Convert} {
		fmt.Printf("%-60.60s %7.2fs  peak RSS %6.1f MiB\n", r.Command, r.Seconds, r.PeakRSSMB)
	}
	fmt.Printf("ratio convert/cp %.2f (target <= %.0f), convert/(cp+fsync) %.2f, RSS %.1f MiB (target <= %.0f)\n",
		rep.RatioVsCp, rep.TargetRatio, rep.RatioVsCpSync, rep.Convert.PeakRSSMB, rep.TargetRSSMiB)
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// measure times one run of a command, adds it to r (median time, largest RSS) and removes
// its output.
func measure(r *run, output string, name string, args ...string) error {
	t, err := timed(name, args...)
	if err != nil {
		return err
	}
	r.Command = t.Command
	r.Runs = append(r.Runs, t.Seconds)
	r.PeakRSSMB = max(r.PeakRSSMB, t.PeakRSSMB)
	sorted := slices.Clone(r.Runs)
	slices.Sort(sorted)
	r.Seconds = sorted[len(sorted)/2]
	return cleanup(output)
}

// cleanup removes a command's output and syncs, so that the next command does not pay
// for its writeback.
func cleanup(path string) error {
	if err := os.RemoveAll(path); err != nil {
		return err
	}
	return exec.Command("sync").Run()
}

// loadavg returns the first three fields of /proc/loadavg, or "" where there is none.
func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(data))
	return strings.Join(f[:min(3, len(f))], " ")
}

// timed runs a command and returns its wall time and peak resident set size.
func timed(name string, args ...string) (run, error) {
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	start := time.Now()
	err := cmd.Run()
	r := run{Command: strings.Join(append([]string{filepath.Base(name)}, args...), " "), Seconds: time.Since(start).Seconds()}
	if err != nil {
		return r, fmt.Errorf("%s: %w", r.Command, err)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.PeakRSSMB = float64(ru.Maxrss) / 1024 // Linux reports KiB
	}
	return r, nil
}

// generate writes n bytes of uint16 tokens below 50257 (GPT-2's vocabulary): a 16 MiB
// block of random tokens, repeated.
func generate(path string, n int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	block := make([]byte, 16<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(block); i += 2 {
		binary.LittleEndian.PutUint16(block[i:], uint16(r.Uint32N(50257)))
	}
	for done := int64(0); done < n; {
		k := min(int64(len(block)), n-done)
		if _, err := f.Write(block[:k]); err != nil {
			f.Close()
			return err
		}
		done += k
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func describeMachine() machine {
	m := machine{NProc: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(data), "MemTotal: %d kB", &kb); err == nil {
			m.MemGB = kb >> 20
		}
	}
	return m
}
