package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
)

// run runs spill with args and returns the exit code, stdout and stderr.
func run(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := runMain(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

// writeTokens writes n little-endian uint16 tokens (i*31 mod 50000) to a .bin file.
func writeTokens(t *testing.T, dir string, n int) string {
	t.Helper()
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(i*31%50000))
	}
	p := filepath.Join(dir, "train.bin")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// assertEmpty fails if dir holds anything.
func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left behind: %s", e.Name())
	}
}

func TestConvertEndToEnd(t *testing.T) {
	in := writeTokens(t, t.TempDir(), 100_001)
	out := filepath.Join(t.TempDir(), "ds")
	code, stdout, stderr := run(t, context.Background(), "convert", in, "--out", out, "--seq-len", "1000",
		"--shard-size", "64KiB", "--chunk-size", "16KiB", "--compress", "zstd", "--level", "1", "--workers", "2", "--vocab", "50000")
	if code != exitOK {
		t.Fatalf("convert: exit %d, stderr %s", code, stderr)
	}
	if !strings.Contains(stdout, "100001 tokens, 100 samples of 1000+1") {
		t.Errorf("summary %q", stdout)
	}
	if stderr != "" {
		t.Errorf("progress drawn on a non-terminal: %q", stderr)
	}
	d, err := dataset.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	m := d.Manifest()
	if d.Len() != 100 || m.Compression != dataset.CompressionZstd || len(m.Shards) < 3 || m.Schema.VocabSize != 50000 {
		t.Fatalf("Len %d, manifest %+v", d.Len(), m)
	}
	s, err := d.Sample(99, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := binary.LittleEndian.Uint16(s[2*1000:]), uint16(100_000*31%50000); got != want {
		t.Fatalf("last token %d, want %d", got, want)
	}

	code, _, stderr = run(t, context.Background(), "convert", "--quiet", "--out", out, in)
	if code != exitFailure || !strings.Contains(stderr, "not empty") {
		t.Fatalf("convert onto an existing dataset: exit %d, stderr %q", code, stderr)
	}
}

func TestConvertQuiet(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "a.txt")
	os.WriteFile(in, []byte("some text to tokenize"), 0o644)
	code, stdout, stderr := run(t, context.Background(), "convert", "--quiet", "--seq-len", "4", "--out", filepath.Join(dir, "o"), in)
	if code != exitOK || stdout != "" || stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestConvertUsageErrors(t *testing.T) {
	dir := t.TempDir()
	in := writeTokens(t, dir, 100)
	out := filepath.Join(dir, "o")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{in}, "--out is required"},
		{[]string{"--out", out}, "no input files"},
		{[]string{"--out", out, "--compress", "lz4", in}, `--compress "lz4"`},
		{[]string{"--out", out, "--shard-size", "lots", in}, `--shard-size "lots"`},
		{[]string{"--out", out, "--chunk-size", "1GiB", in}, `--chunk-size "1GiB"`},
		{[]string{"--out", out, "--format", "xml", in}, `unknown format "xml"`},
		{[]string{"--out", out, "--level", "9", in}, "--level 9"},
		{[]string{"--out", out, "--seq-len", "0", in}, "--seq-len 0"},
		{[]string{"--out", out, "--label-type", "f64", in}, `--label-type "f64"`},
		{[]string{"--out", out, "--header", "maybe", in}, `--header "maybe"`},
	}
	for _, c := range cases {
		code, _, stderr := run(t, context.Background(), append([]string{"convert"}, c.args...)...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("convert %q: exit %d, stderr %q; want exit %d mentioning %q", c.args, code, stderr, exitUsage, c.want)
		}
	}
	if code, _, _ := run(t, context.Background(), "convert", "--no-such-flag"); code != exitUsage {
		t.Errorf("unknown flag: exit %d", code)
	}
	if code, _, stderr := run(t, context.Background(), "convert", "--help"); code != exitOK || !strings.Contains(stderr, "-shard-size") {
		t.Errorf("--help: exit %d, stderr %q", code, stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("usage errors created %s: %v", out, err)
	}
}

func TestConvertFailuresLeaveNothing(t *testing.T) {
	in := t.TempDir()
	bad := filepath.Join(in, "bad.jsonl")
	os.WriteFile(bad, []byte("{\"text\":\"ok\"}\n{\"text\": oops}\n"), 0o644)
	csv := filepath.Join(in, "bad.csv")
	os.WriteFile(csv, []byte("a,b,c\n1,2,3\n4,5\n"), 0o644)
	for _, c := range []struct{ file, want string }{
		{bad, "bad.jsonl:2: malformed JSON"},
		{csv, "bad.csv:3:4: truncated row"},
		{filepath.Join(in, "missing.bin"), "missing.bin"},
	} {
		parent := t.TempDir()
		code, _, stderr := run(t, context.Background(), "convert", "--seq-len", "2", "--out", filepath.Join(parent, "o"), c.file)
		if code != exitFailure || !strings.Contains(stderr, c.want) {
			t.Errorf("convert %s: exit %d, stderr %q; want exit 1 mentioning %q", c.file, code, stderr, c.want)
		}
		assertEmpty(t, parent)
	}
}

func TestConvertInterrupted(t *testing.T) {
	in := writeTokens(t, t.TempDir(), 1<<20)
	parent := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	code, _, stderr := run(t, ctx, "convert", "--out", filepath.Join(parent, "o"), in)
	if code != exitInterrupted || !strings.Contains(stderr, "interrupted") {
		t.Fatalf("exit %d, stderr %q; want %d", code, stderr, exitInterrupted)
	}
	assertEmpty(t, parent)
}

// TestByteSizesAgree: train, plan and convert read a size the same way
// (one parser: "16G" and "16g" are 16 GiB in all three, "16GB" is 16e9).
func TestByteSizesAgree(t *testing.T) {
	for in, want := range map[string]int64{"16G": 16 << 30, "16g": 16 << 30, "16GiB": 16 << 30, "16GB": 16e9, "512mib": 512 << 20} {
		cfg, _, err := parseTrainArgs([]string{"--device-memory", in}, io.Discard)
		if err != nil || cfg.DeviceMemory != want {
			t.Errorf("train --device-memory %s = %d, %v; want %d", in, cfg.DeviceMemory, err, want)
		}
		if got, err := kernels.ParseBytes(in); err != nil || got != want {
			t.Errorf("plan --device-memory %s = %d, %v; want %d", in, got, err, want)
		}
		var f convertFlags
		f.out, f.shardSize, f.chunkSize, f.compress, f.level, f.seqLen, f.header = "x", in, "1MiB", "none", 3, 8, "auto"
		if o, err := f.options(); err != nil || o.Writer.ShardSize != want {
			t.Errorf("convert --shard-size %s = %d, %v; want %d", in, o.Writer.ShardSize, err, want)
		}
	}
	// plan refused a lower-case unit before there was one parser.
	code, _, stderr := run(t, context.Background(), "plan", "--model", "gpt2-124m", "--device-memory", "16g")
	if code != exitOK {
		t.Fatalf("plan --device-memory 16g: exit %d, stderr %s", code, stderr)
	}
}

// TestConvertRemovesStaleTemp: the temporary directory a killed convert
// left next to --out is removed by the next convert of the same name, which
// says so; one that a live writer holds is left alone.
func TestConvertRemovesStaleTemp(t *testing.T) {
	dir := t.TempDir()
	in := writeTokens(t, dir, 5000)
	out := filepath.Join(dir, "ds")
	stale := filepath.Join(dir, ".ds.tmp-123456")
	os.MkdirAll(stale, 0o755)
	os.WriteFile(filepath.Join(stale, "shard-00000.spill"), make([]byte, 3000), 0o644)
	live, err := dataset.Create(context.Background(), out, dataset.WriterOptions{Schema: dataset.Schema{Kind: dataset.KindTokens, TokenDType: "uint16", SeqLen: 8}})
	if err != nil {
		t.Fatal(err)
	}
	if len(live.StaleTemps()) != 1 || live.StaleTemps()[0].Path != stale || live.StaleTemps()[0].Bytes != 3000 {
		t.Errorf("Create removed %+v", live.StaleTemps())
	}
	defer live.Abort()
	// A leftover from a run killed before this one (no lock held).
	os.MkdirAll(stale, 0o755)
	code, _, stderr := run(t, context.Background(), "convert", "--out", out, "--seq-len", "64", "--quiet", in)
	if code != exitOK || !strings.Contains(stderr, "removed "+stale+" (0 B), left by an interrupted conversion") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if strings.Count(stderr, "removed") != 1 {
		t.Errorf("the live writer's directory was removed too: %q", stderr)
	}
	ents, _ := os.ReadDir(dir)
	var tmps int
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".ds.tmp-") {
			tmps++
		}
	}
	if tmps != 1 {
		t.Errorf("%d temporary directories next to %s, want the live writer's only", tmps, out)
	}
}

// TestConvertBinThenTrain: a train.bin converted without --vocab trains
// (it failed in train with "vocabulary of 257": the manifest now records the
// GPT-2 vocabulary), and inspect names the tokenizer.
func TestConvertBinThenTrain(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "ds")
	if code, _, stderr := run(t, context.Background(), "convert", "--out", out, "--seq-len", "16", "--quiet", writeTokens(t, dir, 4000)); code != exitOK {
		t.Fatalf("convert: exit %d: %s", code, stderr)
	}
	if code, stdout, _ := run(t, context.Background(), "inspect", out); code != exitOK || !strings.Contains(stdout, "vocab 50257, tokenizer gpt2") {
		t.Errorf("inspect: exit %d\n%s", code, stdout)
	}
	code, _, stderr := run(t, context.Background(), "train", "--data", out, "--layers", "1", "--heads", "2", "--embd", "32", "--max-seq", "16",
		"--steps", "1", "--batch", "2", "--eval-every", "0", "--threads", "2", "--quiet")
	if code != exitOK {
		t.Fatalf("train: exit %d: %s", code, stderr)
	}
}

// TestConvertTokenizer: --tokenizer gpt2 tokenizes text; inspect shows the
// tokenizer and vocabulary; train sizes the tiny model for it; a bad name
// is a usage error that lists the choices.
func TestConvertTokenizer(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "a.txt")
	os.WriteFile(in, []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 200)), 0o644)
	out := filepath.Join(dir, "ds")
	if code, _, stderr := run(t, context.Background(), "convert", "--out", out, "--seq-len", "16", "--tokenizer", "gpt2", "--quiet", in); code != exitOK {
		t.Fatalf("convert: exit %d: %s", code, stderr)
	}
	if code, stdout, _ := run(t, context.Background(), "inspect", out); code != exitOK || !strings.Contains(stdout, "vocab 50257, tokenizer gpt2") || !strings.Contains(stdout, "(2001 tokens)") {
		t.Errorf("inspect: exit %d\n%s", code, stdout)
	}
	code, _, stderr := run(t, context.Background(), "train", "--data", out, "--layers", "1", "--heads", "2", "--embd", "32", "--max-seq", "16",
		"--vocab", "1000", "--steps", "1", "--batch", "2", "--eval-every", "0", "--threads", "2", "--quiet")
	if code != exitFailure || !strings.Contains(stderr, "vocabulary 50257 (tokenizer gpt2), larger than the model's 1000: train with --vocab 50257") {
		t.Errorf("train with a small vocab: exit %d: %s", code, stderr)
	}
	if code, _, stderr := run(t, context.Background(), "convert", "--out", out+"2", "--tokenizer", "llama", in); code != exitUsage || !strings.Contains(stderr, "cl100k_base") {
		t.Errorf("bad tokenizer: exit %d: %s", code, stderr)
	}
}

// TestConvertIrisLabels: the README's iris command needs no --label-type;
// inspect shows the class names, and an MLP trains on the class ids.
func TestConvertIrisLabels(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "iris.csv")
	var b strings.Builder
	b.WriteString("sepal_length,sepal_width,petal_length,petal_width,species\n")
	for i := range 60 {
		b.WriteString([]string{"5.1,3.5,1.4,0.2,setosa\n", "7.0,3.2,4.7,1.4,versicolor\n", "6.3,3.3,6.0,2.5,virginica\n"}[i%3])
	}
	os.WriteFile(in, []byte(b.String()), 0o644)
	out := filepath.Join(dir, "iris")
	if code, _, stderr := run(t, context.Background(), "convert", "--out", out, "--label-col", "species", "--quiet", in); code != exitOK {
		t.Fatalf("convert: exit %d: %s", code, stderr)
	}
	if code, stdout, _ := run(t, context.Background(), "inspect", out); code != exitOK || !strings.Contains(stdout, "int32 label") ||
		!strings.Contains(stdout, "; label species; classes 0=setosa, 1=versicolor, 2=virginica") {
		t.Errorf("inspect: exit %d\n%s", code, stdout)
	}
	if code, _, stderr := run(t, context.Background(), "train", "--data", out, "--model", "mlp", "--hidden", "8", "--steps", "2", "--batch", "4",
		"--eval-every", "0", "--threads", "2", "--quiet"); code != exitOK {
		t.Errorf("train: exit %d: %s", code, stderr)
	}
}
