package ingest

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spill-ml/spill/dataset"
)

// byteStream is the byte-level tokenization of docs.
func byteStream(docs ...string) []uint32 {
	var out []uint32
	for i, d := range docs {
		if i > 0 {
			out = append(out, EOT)
		}
		for _, b := range []byte(d) {
			out = append(out, uint32(b))
		}
	}
	return out
}

func TestTextAndJSONL(t *testing.T) {
	dir := t.TempDir()
	a := writeFile(t, dir, "a.txt", []byte("hello, world\nsecond line\n"))
	// A null text is no document, as a Parquet null is (it repeated the
	// previous line's text before).
	j := writeFile(t, dir, "b.jsonl", []byte("{\"text\": \"caf\\u00e9\", \"id\": 1}\n\n{\"id\": 2, \"text\": \"line\\nbreak\"}\r\n{\"text\": null}\n{\"text\":\"last\"}"))
	c := writeFile(t, dir, "c.txt", []byte("\x00\xff bytes"))
	d, _ := convertOK(t, []string{a, j, c}, Options{SeqLen: 3, Writer: dataset.WriterOptions{Compression: dataset.CompressionZstd}})
	s := d.Schema()
	if s.VocabSize != ByteVocab || s.TokenDType != "uint16" {
		t.Fatalf("schema %+v, want byte vocab 257 uint16", s)
	}
	wantTokens(t, d, byteStream("hello, world\nsecond line\n", "café", "line\nbreak", "last", "\x00\xff bytes"))
}

func TestJSONLFieldAndLongLine(t *testing.T) {
	long := strings.Repeat("x", 3<<19) // longer than the line reader's buffer
	var b bytes.Buffer
	b.WriteString(`{"content": "short"}` + "\n")
	b.WriteString(`{"content": "` + long + `"}` + "\n")
	p := writeFile(t, t.TempDir(), "docs.jsonl", b.Bytes())
	d, _ := convertOK(t, []string{p}, Options{SeqLen: 1000, Field: "content", TokenDType: "uint32", Vocab: 300})
	if s := d.Schema(); s.TokenDType != "uint32" || s.VocabSize != 300 {
		t.Fatalf("schema %+v", s)
	}
	wantTokens(t, d, byteStream("short", long))
}

func TestJSONLMalformed(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, data string
		wants      []string
	}{
		{"broken.jsonl", "{\"text\":\"a\"}\n{\"text\":\"b\"}\n{\"text\": \"c\n", []string{"broken.jsonl:3:", "malformed JSON"}},
		{"nofield.jsonl", "{\"text\":\"a\"}\n{\"body\":\"b\"}\n", []string{"nofield.jsonl:2:", `no field "text"`}},
		{"notstring.jsonl", "{\"text\":5}\n", []string{"notstring.jsonl:1:", "not a string"}},
		{"array.jsonl", "\n[1,2]\n", []string{"array.jsonl:2:", "want a JSON object"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := writeFile(t, dir, c.name, []byte(c.data))
			convertFail(t, []string{p}, Options{SeqLen: 1}, c.wants...)
		})
	}
}

func TestByteVocabTooSmall(t *testing.T) {
	p := writeFile(t, t.TempDir(), "a.txt", []byte("abcdef"))
	convertFail(t, []string{p}, Options{SeqLen: 2, Vocab: 100}, "a.txt", "smaller than the byte tokenizer's 257")
}
