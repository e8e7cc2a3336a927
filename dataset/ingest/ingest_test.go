package ingest

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spill-ml/spill/dataset"
)

// writeFile writes data to name inside dir and returns its path.
func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// convertOK converts inputs into a fresh directory and opens the result.
func convertOK(t *testing.T, inputs []string, o Options) (*dataset.Dataset, *dataset.Manifest) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	m, err := Convert(context.Background(), out, inputs, o)
	if err != nil {
		t.Fatalf("Convert: %v", err)
	}
	d, err := dataset.Open(out)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Verify(context.Background(), nil); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return d, m
}

// convertFail converts inputs, expects an error containing every want, and checks that
// nothing was left in the output's parent directory.
func convertFail(t *testing.T, inputs []string, o Options, wants ...string) error {
	t.Helper()
	return convertFailCtx(t, context.Background(), inputs, o, wants...)
}

func convertFailCtx(t *testing.T, ctx context.Context, inputs []string, o Options, wants ...string) error {
	t.Helper()
	parent := t.TempDir()
	_, err := Convert(ctx, filepath.Join(parent, "out"), inputs, o)
	if err == nil {
		t.Fatalf("Convert succeeded, want an error containing %q", wants)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		t.Errorf("left behind after error: %s", e.Name())
	}
	return err
}

// streamTokens reassembles the token stream of a tokens dataset (the tokens covered by
// its samples: Len*SeqLen+1 of them).
func streamTokens(t *testing.T, d *dataset.Dataset) []uint32 {
	t.Helper()
	s := d.Schema()
	if s.Kind != dataset.KindTokens {
		t.Fatalf("kind %s, want tokens", s.Kind)
	}
	ts := s.TokenSize()
	var toks []uint32
	var buf []byte
	for i := range d.Len() {
		b, err := d.Sample(i, buf)
		if err != nil {
			t.Fatalf("Sample(%d): %v", i, err)
		}
		if len(b) != (s.SeqLen+1)*ts {
			t.Fatalf("sample %d: %d bytes", i, len(b))
		}
		start := 0
		if i > 0 {
			start = 1 // first token repeats the previous sample's last
			if prev := toks[len(toks)-1]; tokenAt(b, 0, ts) != prev {
				t.Fatalf("sample %d starts with %d, previous ended with %d", i, tokenAt(b, 0, ts), prev)
			}
		}
		for j := start; j <= s.SeqLen; j++ {
			toks = append(toks, tokenAt(b, j, ts))
		}
	}
	return toks
}

func tokenAt(b []byte, j, ts int) uint32 {
	if ts == 2 {
		return uint32(binary.LittleEndian.Uint16(b[2*j:]))
	}
	return binary.LittleEndian.Uint32(b[4*j:])
}

// wantTokens checks that d's token stream is the covered prefix of want.
func wantTokens(t *testing.T, d *dataset.Dataset, want []uint32) {
	t.Helper()
	seq := int64(d.Schema().SeqLen)
	if n := (int64(len(want)) - 1) / seq; d.Len() != n {
		t.Fatalf("Len = %d, want %d for %d tokens of seq-len %d", d.Len(), n, len(want), seq)
	}
	got := streamTokens(t, d)
	want = want[:d.Len()*seq+1]
	if len(got) != len(want) {
		t.Fatalf("%d tokens, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("token %d = %d, want %d", i, got[i], want[i])
		}
	}
}

// records returns every record of d split into raw feature and label words.
func records(t *testing.T, d *dataset.Dataset) (feats [][]uint32, labels []uint32) {
	t.Helper()
	s := d.Schema()
	if s.Kind != dataset.KindRecords {
		t.Fatalf("kind %s, want records", s.Kind)
	}
	var buf []byte
	for i := range d.Len() {
		b, err := d.Sample(i, buf)
		if err != nil {
			t.Fatalf("Sample(%d): %v", i, err)
		}
		f := make([]uint32, s.Features)
		for j := range f {
			f[j] = binary.LittleEndian.Uint32(b[4*j:])
		}
		feats = append(feats, f)
		labels = append(labels, binary.LittleEndian.Uint32(b[4*s.Features:]))
	}
	return feats, labels
}

func TestDetectFormat(t *testing.T) {
	cases := map[string]Format{
		"a/train.bin": FormatBin, "x.npy": FormatNPY, "x.JSONL": FormatJSONL, "x.ndjson": FormatJSONL,
		"x.txt": FormatText, "x.csv": FormatCSV, "x.parquet": FormatParquet,
	}
	for p, want := range cases {
		if got, err := DetectFormat(p); err != nil || got != want {
			t.Errorf("DetectFormat(%q) = %q, %v; want %q", p, got, err, want)
		}
	}
	if _, err := DetectFormat("data.xyz"); err == nil || !strings.Contains(err.Error(), "data.xyz") || !strings.Contains(err.Error(), "--format") {
		t.Errorf("DetectFormat(data.xyz) error = %v, want one naming the file and --format", err)
	}
	if f, err := ParseFormat("txt"); err != nil || f != FormatText {
		t.Errorf("ParseFormat(txt) = %q, %v", f, err)
	}
	if _, err := ParseFormat("xml"); err == nil {
		t.Error("ParseFormat(xml) succeeded")
	}
}

func TestFormatOverride(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "tokens.dat", le16(0, 1, 2, 3, 4, 5, 6, 7, 8))
	convertFail(t, []string{p}, Options{SeqLen: 4}, "tokens.dat", "--format")
	d, _ := convertOK(t, []string{p}, Options{SeqLen: 4, Format: FormatBin})
	wantTokens(t, d, []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8})
}

func TestMixedKindsRejected(t *testing.T) {
	dir := t.TempDir()
	bin := writeFile(t, dir, "a.bin", le16(1, 2, 3, 4, 5))
	csv := writeFile(t, dir, "b.csv", []byte("1,2\n3,4\n"))
	convertFail(t, []string{bin, csv}, Options{SeqLen: 2}, "b.csv", "records", "tokens")
}

func TestTooFewTokens(t *testing.T) {
	p := writeFile(t, t.TempDir(), "a.bin", le16(1, 2, 3))
	convertFail(t, []string{p}, Options{SeqLen: 8}, "3 tokens", "seq-len+1 = 9")
}

func TestConvertCancelled(t *testing.T) {
	p := writeFile(t, t.TempDir(), "a.bin", make([]byte, 3<<20))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := convertFailCtx(t, ctx, []string{p}, Options{SeqLen: 16})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
}

func TestBadOptions(t *testing.T) {
	p := writeFile(t, t.TempDir(), "a.bin", le16(1, 2, 3))
	convertFail(t, []string{p}, Options{SeqLen: -1, TokenDType: "int8", LabelType: "f16"}, "seq-len -1", "int8", "f16")
	convertFail(t, nil, Options{}, "no input files")
	convertFail(t, []string{filepath.Join(t.TempDir(), "missing.bin")}, Options{}, "missing.bin")
}

// le16 returns the little-endian uint16 encoding of vals.
func le16(vals ...uint16) []byte {
	b := make([]byte, 0, 2*len(vals))
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint16(b, v)
	}
	return b
}

func TestParentDirectories(t *testing.T) {
	in := writeFile(t, t.TempDir(), "a.bin", le16(1, 2, 3, 4, 5))
	root := t.TempDir()
	out := filepath.Join(root, "x", "y", "ds")
	if _, err := Convert(context.Background(), out, []string{in}, Options{SeqLen: 2}); err != nil {
		t.Fatalf("Convert into missing parents: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, "manifest.json")); err != nil {
		t.Fatal(err)
	}
	// A failed conversion removes the parents it made.
	bad := filepath.Join(root, "p", "q", "ds")
	if _, err := Convert(context.Background(), bad, []string{in}, Options{SeqLen: 2, Vocab: 3}); err == nil {
		t.Fatal("token 4 passed a vocab of 3")
	}
	if _, err := os.Stat(filepath.Join(root, "p")); !os.IsNotExist(err) {
		t.Fatalf("parent left behind: %v", err)
	}
}
