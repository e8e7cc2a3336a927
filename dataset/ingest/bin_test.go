package ingest

import (
	"math/rand/v2"
	"testing"

	"github.com/spill-ml/spill/dataset"
)

func randTokens(n int, max uint32, seed uint64) ([]uint16, []uint32) {
	r := rand.New(rand.NewPCG(seed, 1))
	t16 := make([]uint16, n)
	t32 := make([]uint32, n)
	for i := range t16 {
		t16[i] = uint16(r.Uint32N(max))
		t32[i] = uint32(t16[i])
	}
	return t16, t32
}

func TestBinRoundTrip(t *testing.T) {
	dir := t.TempDir()
	t16, want := randTokens(20001, 50257, 1)
	p := writeFile(t, dir, "train.bin", le16(t16...))
	for _, c := range []dataset.Compression{dataset.CompressionNone, dataset.CompressionZstd} {
		t.Run(string(c), func(t *testing.T) {
			o := Options{SeqLen: 100, Vocab: 50257,
				Writer: dataset.WriterOptions{ShardSize: 8 << 10, ChunkSize: 1 << 10, Compression: c}}
			d, m := convertOK(t, []string{p}, o)
			s := d.Schema()
			if s.TokenDType != "uint16" || s.VocabSize != 50257 || s.SeqLen != 100 {
				t.Fatalf("schema %+v", s)
			}
			if len(m.Shards) < 2 {
				t.Fatalf("%d shards, want several with an 8 KiB shard size", len(m.Shards))
			}
			wantTokens(t, d, want)
		})
	}
}

func TestBinConcatAndWiden(t *testing.T) {
	dir := t.TempDir()
	a16, a := randTokens(301, 65536, 2)
	b16, b := randTokens(500, 65536, 3)
	pa := writeFile(t, dir, "a.bin", le16(a16...))
	pb := writeFile(t, dir, "b.bin", le16(b16...))
	d, _ := convertOK(t, []string{pa, pb}, Options{SeqLen: 10, TokenDType: "uint32", Vocab: 65536})
	if d.Schema().TokenDType != "uint32" {
		t.Fatalf("token dtype %s, want uint32", d.Schema().TokenDType)
	}
	wantTokens(t, d, append(a, b...))
}

// TestBinDefaultVocab: a .bin converted without --vocab records the GPT-2
// vocabulary a nanoGPT train.bin holds (train then sizes the model for it,
// not for 257 tokens); a token above it is refused, naming --vocab.
func TestBinDefaultVocab(t *testing.T) {
	dir := t.TempDir()
	t16, _ := randTokens(3000, 50257, 4)
	d, _ := convertOK(t, []string{writeFile(t, dir, "train.bin", le16(t16...))}, Options{SeqLen: 10})
	if s := d.Schema(); s.VocabSize != GPT2Vocab || s.Tokenizer != "gpt2" {
		t.Fatalf("schema %+v", s)
	}
	t16[100] = 60000
	convertFail(t, []string{writeFile(t, dir, "other.bin", le16(t16...))}, Options{SeqLen: 10},
		"other.bin", "element 100", "token 60000 out of range for vocab size 50257", "--vocab")
}

func TestBinBadInput(t *testing.T) {
	dir := t.TempDir()
	odd := writeFile(t, dir, "odd.bin", []byte{1, 0, 2})
	convertFail(t, []string{odd}, Options{SeqLen: 1}, "odd.bin", "size 3 is odd")

	toks := make([]uint16, 40)
	toks[17] = 5000
	big := writeFile(t, dir, "big.bin", le16(toks...))
	convertFail(t, []string{big}, Options{SeqLen: 4, Vocab: 1000}, "big.bin", "element 17", "token 5000", "vocab size 1000")
}
