package engine

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/spill-ml/spill/dataset"
)

func TestDefaultDatasetTokens(t *testing.T) {
	toks := DefaultDatasetTokens()
	if !reflect.DeepEqual(toks, DefaultDatasetTokens()) {
		t.Fatal("generation is not deterministic")
	}
	// Every document is defaultDocLines correct equations ended by EOT.
	var doc []byte
	docs := 0
	for _, tk := range toks {
		if tk == byteEOT {
			lines := strings.Split(strings.TrimSuffix(string(doc), "\n"), "\n")
			if len(lines) != defaultDocLines {
				t.Fatalf("document %d has %d lines", docs, len(lines))
			}
			for _, l := range lines {
				lhs, rhs, ok := strings.Cut(l, "=")
				c, err := strconv.Atoi(rhs)
				op := strings.IndexAny(lhs, "+-")
				if !ok || err != nil || op <= 0 {
					t.Fatalf("bad line %q", l)
				}
				a, _ := strconv.Atoi(lhs[:op])
				b, _ := strconv.Atoi(lhs[op+1:])
				if (lhs[op] == '+' && a+b != c) || (lhs[op] == '-' && a-b != c) || c < 0 {
					t.Fatalf("wrong equation %q", l)
				}
			}
			docs++
			doc = doc[:0]
			continue
		}
		if tk > 255 {
			t.Fatalf("token %d out of byte range", tk)
		}
		doc = append(doc, byte(tk))
	}
	if docs != defaultDatasetDocs || len(doc) != 0 {
		t.Errorf("%d documents (+%d trailing bytes), want %d", docs, len(doc), defaultDatasetDocs)
	}
}

func TestDefaultDataset(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	path, err := DefaultDataset(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, DefaultDatasetName) {
		t.Errorf("path %s", path)
	}
	d, err := dataset.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	toks := DefaultDatasetTokens()
	s := d.Schema()
	if s.SeqLen != DefaultDatasetSeqLen || s.VocabSize != 257 || s.TokenDType != "uint16" {
		t.Errorf("schema %+v", s)
	}
	if want := int64((len(toks) - 1) / DefaultDatasetSeqLen); d.Len() != want {
		t.Errorf("%d samples, want %d", d.Len(), want)
	}
	// Sample 3 is tokens[3*64 : 3*64+65].
	b, err := d.Sample(3, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i <= DefaultDatasetSeqLen; i++ {
		if got := binary.LittleEndian.Uint16(b[2*i:]); got != toks[3*DefaultDatasetSeqLen+i] {
			t.Fatalf("sample 3 token %d = %d, want %d", i, got, toks[3*DefaultDatasetSeqLen+i])
		}
	}
	man, _ := os.ReadFile(filepath.Join(path, "manifest.json"))
	d.Close()

	// A second call reuses the complete copy.
	if p2, err := DefaultDataset(ctx, dir); err != nil || p2 != path {
		t.Fatalf("second call: %q, %v", p2, err)
	}
	man2, _ := os.ReadFile(filepath.Join(path, "manifest.json"))
	if string(man) != string(man2) {
		t.Error("complete dataset was rewritten")
	}
	// A damaged copy is replaced.
	os.Remove(filepath.Join(path, "manifest.json"))
	if _, err := DefaultDataset(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if d, err := dataset.Open(path); err != nil {
		t.Errorf("after repair: %v", err)
	} else {
		d.Close()
	}
}
