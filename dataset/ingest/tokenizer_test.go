package ingest

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/spill-ml/spill/dataset/tokenize"
)

// tokDocs is text with documents of very different lengths, so that jobs
// hold many documents or a piece of one.
func tokDocs() []string {
	var docs []string
	for i := range 40 {
		var b strings.Builder
		for j := range (i * 37) % 300 {
			fmt.Fprintf(&b, "Line %d of doc %d: it's  naïve café, 東京 %d!\n", j, i, j*j)
			if j%7 == 0 {
				b.WriteString("   indented\ttext\n\n")
			}
		}
		docs = append(docs, b.String())
	}
	return docs
}

// wantIDs is the reference: each document encoded whole, EOT between.
func wantIDs(tk tokenize.Tokenizer, docs []string) []uint32 {
	enc := tk.NewEncoder()
	var ids []uint32
	for i, d := range docs {
		if i > 0 {
			ids = append(ids, tk.EOT())
		}
		ids = enc.Encode(ids, []byte(d))
	}
	return ids
}

// TestTokenizerPipeline: text, JSONL and Parquet text through gpt2 and
// cl100k_base, cut into small jobs encoded by several goroutines, give the
// same ids as encoding each document whole; the manifest records the
// tokenizer and its vocabulary.
func TestTokenizerPipeline(t *testing.T) {
	defer func(j, h int) { tokJobBytes, tokHardCap = j, h }(tokJobBytes, tokHardCap)
	tokJobBytes, tokHardCap = 700, 1<<20
	docs := tokDocs()
	dir := t.TempDir()
	var txts []string
	for i, d := range docs[:3] {
		txts = append(txts, writeFile(t, dir, fmt.Sprintf("%d.txt", i), []byte(d)))
	}
	var jl strings.Builder
	for _, d := range docs {
		fmt.Fprintf(&jl, "{\"text\": %q}\n", d)
	}
	jsonl := writeFile(t, dir, "d.jsonl", []byte(jl.String()))
	var rows []textRow
	for i, d := range docs {
		rows = append(rows, textRow{ID: int64(i), Text: &d})
	}
	pq := filepath.Join(dir, "d.parquet")
	if err := parquet.WriteFile(pq, rows, parquet.MaxRowsPerRowGroup(8)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gpt2", "cl100k_base"} {
		tk, err := tokenize.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name   string
			inputs []string
			docs   []string
		}{{"text", txts, docs[:3]}, {"jsonl", []string{jsonl}, docs}, {"parquet", []string{pq}, docs}} {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				d, _ := convertOK(t, c.inputs, Options{SeqLen: 16, Tokenizer: tk, TokenizerWorkers: 3})
				s := d.Schema()
				wantDT := map[string]string{"gpt2": "uint16", "cl100k_base": "uint32"}[name]
				if s.Tokenizer != name || s.VocabSize != tk.Vocab() || s.TokenDType != wantDT {
					t.Fatalf("schema %+v", s)
				}
				want := wantIDs(tk, c.docs)
				got := streamTokens(t, d)
				if len(got) > len(want) || !reflect.DeepEqual(got, want[:len(got)]) || len(want)-len(got) > 16 {
					t.Fatalf("%d ids, want %d (the first %d)", len(got), len(want), len(got))
				}
			})
		}
	}
}

// TestSafeCut: cutting text at safeCut's points and encoding the pieces
// gives the ids of the whole.
func TestSafeCut(t *testing.T) {
	tk, _ := tokenize.Open("gpt2")
	enc := tk.NewEncoder()
	text := []byte(strings.Join(tokDocs()[5:8], "  \n \n\tx y"))
	whole := enc.Encode(nil, text)
	var pieces []uint32
	n := 0
	for rest := text; len(rest) > 0; n++ {
		cut := 0
		for w := 97; cut == 0 && w < len(rest); w *= 2 {
			cut = safeCut(rest[:w], 0)
		}
		if cut == 0 {
			cut = len(rest)
		}
		pieces = enc.Encode(pieces, rest[:cut])
		rest = rest[cut:]
	}
	if !reflect.DeepEqual(pieces, whole) || n < len(text)/200 {
		t.Fatalf("%d pieces give %d ids, whole %d", n, len(pieces), len(whole))
	}
}
