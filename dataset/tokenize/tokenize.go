// Package tokenize turns text into token ids for spill convert: the
// byte-level tokenizer, OpenAI's BPE encodings (gpt2, cl100k_base,
// o200k_base, from github.com/tiktoken-go/tokenizer, which embeds their
// ranks; gpt2 is encoded by this package's BPE, see ranks.go) and the
// byte-level BPE of a Hugging Face tokenizer.json file (read by this
// package; see hf.go).
//
// A Tokenizer is shared; each goroutine that encodes takes its own Encoder
// from NewEncoder (encoders keep per-goroutine caches).
package tokenize

import (
	"fmt"
	"os"
	"strings"
	"sync"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

// Tokenizer describes a tokenizer and makes encoders.
type Tokenizer interface {
	// Name is what the dataset manifest records ("gpt2", "hf:FILE@sha256:...").
	Name() string
	// Vocab is the vocabulary size: every id is below it.
	Vocab() int
	// EOT is the end-of-text id put between documents.
	EOT() uint32
	// NewEncoder returns an encoder for one goroutine.
	NewEncoder() Encoder
}

// Encoder encodes text; it is not safe for concurrent use.
type Encoder interface {
	// Encode appends the ids of text to dst and returns it. text is not
	// retained.
	Encode(dst []uint32, text []byte) []uint32
}

// Names lists the built-in tokenizer names (a path to a tokenizer.json
// file is accepted too).
var Names = []string{"byte", "gpt2", "cl100k_base", "o200k_base"}

// Byte-level tokenizer constants: each byte is its own id, EOT 256.
const (
	ByteEOT   = 256
	ByteVocab = 257
)

// Open returns the tokenizer called name: one of Names, or the path of a
// Hugging Face tokenizer.json (a name ending in .json, or an existing file).
func Open(name string) (Tokenizer, error) {
	switch name {
	case "byte":
		return byteTokenizer{}, nil
	case "gpt2", "r50k_base":
		return newRankBPE("gpt2", tiktoken.R50kBase, 50256, 50256, 50257)
	case "cl100k_base":
		return newTiktoken(name, tiktoken.Cl100kBase, 100257, 100277)
	case "o200k_base":
		return newTiktoken(name, tiktoken.O200kBase, 199999, 200019)
	}
	if strings.HasSuffix(name, ".json") || fileExists(name) {
		return OpenHF(name)
	}
	return nil, fmt.Errorf("tokenizer %q: want one of %s, or the path of a Hugging Face tokenizer.json", name, strings.Join(Names, ", "))
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// byteTokenizer maps each byte to the id of its value.
type byteTokenizer struct{}

func (byteTokenizer) Name() string        { return "byte" }
func (byteTokenizer) Vocab() int          { return ByteVocab }
func (byteTokenizer) EOT() uint32         { return ByteEOT }
func (byteTokenizer) NewEncoder() Encoder { return byteEncoder{} }

type byteEncoder struct{}

func (byteEncoder) Encode(dst []uint32, text []byte) []uint32 {
	for _, b := range text {
		dst = append(dst, uint32(b))
	}
	return dst
}

// tiktokenizer is one of OpenAI's encodings. Invalid UTF-8 in the input
// becomes U+FFFD first (tiktoken's errors="replace"), as the encodings work
// on characters.
type tiktokenizer struct {
	name  string
	enc   tiktoken.Encoding
	eot   uint32
	vocab int

	once  sync.Once
	codec tiktoken.Codec
	err   error
}

func newTiktoken(name string, enc tiktoken.Encoding, eot uint32, vocab int) (*tiktokenizer, error) {
	t := &tiktokenizer{name: name, enc: enc, eot: eot, vocab: vocab}
	if _, err := t.get(); err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", name, err)
	}
	return t, nil
}

// get returns the codec, built once (its tables are large).
func (t *tiktokenizer) get() (tiktoken.Codec, error) {
	t.once.Do(func() {
		t.codec, t.err = tiktoken.Get(t.enc)
		if t.err == nil {
			t.codec.SetErrorMode(tiktoken.ErrorModeReplace)
		}
	})
	return t.codec, t.err
}

func (t *tiktokenizer) Name() string { return t.name }
func (t *tiktokenizer) Vocab() int   { return t.vocab }
func (t *tiktokenizer) EOT() uint32  { return t.eot }

// NewEncoder returns an encoder sharing the codec: its Encode only reads
// the codec's tables (the regexp is safe for concurrent use).
func (t *tiktokenizer) NewEncoder() Encoder {
	c, _ := t.get()
	return tiktokenEncoder{c}
}

type tiktokenEncoder struct{ c tiktoken.Codec }

func (e tiktokenEncoder) Encode(dst []uint32, text []byte) []uint32 {
	ids, _, err := e.c.Encode(string(text))
	if err != nil {
		// Only the regexp's timeout can fail, and none is set.
		panic(fmt.Sprintf("tokenize: %v", err))
	}
	for _, id := range ids {
		dst = append(dst, uint32(id))
	}
	return dst
}
