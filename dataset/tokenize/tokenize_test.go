package tokenize

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

func encode(t *testing.T, tk Tokenizer, s string) []uint32 {
	t.Helper()
	return tk.NewEncoder().Encode(nil, []byte(s))
}

// TestKnownEncodings checks the built-in tokenizers against ids published
// for them (tiktoken's own tests and OpenAI's tokenizer page).
func TestKnownEncodings(t *testing.T) {
	for _, c := range []struct {
		name  string
		text  string
		want  []uint32
		vocab int
		eot   uint32
	}{
		{"byte", "hi!", []uint32{104, 105, 33}, 257, 256},
		{"gpt2", "hello world", []uint32{31373, 995}, 50257, 50256},
		{"cl100k_base", "hello world", []uint32{15339, 1917}, 100277, 100257},
		{"o200k_base", "hello world", []uint32{24912, 2375}, 200019, 199999},
	} {
		tk, err := Open(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if got := encode(t, tk, c.text); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s(%q) = %v, want %v", c.name, c.text, got, c.want)
		}
		if tk.Vocab() != c.vocab || tk.EOT() != c.eot || tk.Name() != c.name {
			t.Errorf("%s: name %s vocab %d eot %d", c.name, tk.Name(), tk.Vocab(), tk.EOT())
		}
	}
	if _, err := Open("llama"); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("Open(llama): %v", err)
	}
}

// TestEOTAndVocabOfTiktoken: the end-of-text id is past the ordinary
// tokens (cl100k and o200k leave one id unused before it).
func TestEOTAndVocabOfTiktoken(t *testing.T) {
	for _, c := range []struct {
		name string
		enc  tiktoken.Encoding
	}{{"gpt2", tiktoken.R50kBase}, {"cl100k_base", tiktoken.Cl100kBase}, {"o200k_base", tiktoken.O200kBase}} {
		name := c.name
		tk, _ := Open(name)
		c, _ := tiktoken.Get(c.enc)
		if _, err := c.Decode([]uint{uint(tk.EOT()) - 2}); err != nil {
			t.Errorf("%s: id %d below EOT does not decode: %v", name, tk.EOT()-2, err)
		}
		if _, err := c.Decode([]uint{uint(tk.EOT())}); err == nil {
			t.Errorf("%s: EOT %d decodes as an ordinary token", name, tk.EOT())
		}
	}
}

// gpt2TokenizerJSON rebuilds GPT-2's byte-level BPE as a Hugging Face
// tokenizer.json from tiktoken's ranks: token r >= 256 is the merge of the
// two symbols that BPE with the merges of lower rank leaves of its bytes.
func gpt2TokenizerJSON(t testing.TB) []byte {
	c, err := tiktoken.Get(tiktoken.R50kBase)
	if err != nil {
		t.Fatal(err)
	}
	const n = 50256
	chars := byteChars()
	mapped := func(b []byte) string {
		var sb strings.Builder
		for _, x := range b {
			sb.WriteString(chars[x])
		}
		return sb.String()
	}
	tok := &hfTokenizer{merges: map[uint64]merge{}}
	vocab := map[string]int{}
	raw := make([][]byte, n)
	for id := range n {
		s, err := c.Decode([]uint{uint(id)})
		if err != nil {
			t.Fatal(err)
		}
		raw[id] = []byte(s)
		vocab[mapped(raw[id])] = id
		if len(raw[id]) == 1 {
			tok.byteID[raw[id][0]] = int32(id)
		}
	}
	var merges []string
	var scratch []int32
	for id := range n {
		if len(raw[id]) == 1 {
			continue
		}
		parts := tok.bpe(nil, raw[id], &scratch)
		if len(parts) != 2 {
			t.Fatalf("token %d %q: BPE of lower ranks leaves %d symbols", id, raw[id], len(parts))
		}
		tok.merges[uint64(parts[0])<<32|uint64(parts[1])] = merge{rank: int32(len(merges)), id: int32(id)}
		merges = append(merges, mapped(raw[parts[0]])+" "+mapped(raw[parts[1]]))
	}
	js, err := json.Marshal(map[string]any{
		"version":        "1.0",
		"added_tokens":   []map[string]any{{"id": n, "content": "<|endoftext|>", "special": true}},
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": map[string]any{"type": "ByteLevel"},
		"decoder":        map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "dropout": nil, "vocab": vocab, "merges": merges},
	})
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// sampleText mixes what the pre-tokenizer distinguishes: contractions,
// letters and digits of several scripts, punctuation runs, every kind of
// whitespace run before words and at the end.
const sampleText = "Hello world! It's a test: we'll see, they've 12345 apples & 3.14 pies.\n\n" +
	"  Indented   line\twith\ttabs\r\nCRLF line\u00a0nbsp\u3000ideographic space\n" +
	"naïve café — «quotes» 東京タワー 2024年 Привет, мир! ١٢٣ مرحبا 🙂🙃 emoji\n" +
	"don't DON'T 'quoted' ''double'' x'y 'S 'LL\n   \n\t\n" +
	"code: for (i = 0; i < n; i++) { a[i] += b[i]; } // done...\n" +
	"trailing spaces   "

// TestHFMatchesTiktokenGPT2: GPT-2 read as a tokenizer.json encodes every
// sample exactly as tiktoken's gpt2 does (pre-tokenizer and BPE both).
func TestHFMatchesTiktokenGPT2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, gpt2TokenizerJSON(t), 0o644); err != nil {
		t.Fatal(err)
	}
	hf, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if hf.Vocab() != 50257 || hf.EOT() != 50256 || !strings.HasPrefix(hf.Name(), "hf:tokenizer.json@sha256:") {
		t.Fatalf("name %s vocab %d eot %d", hf.Name(), hf.Vocab(), hf.EOT())
	}
	ref, _ := Open("gpt2")
	he, re := hf.NewEncoder(), ref.NewEncoder()
	texts := append(strings.Split(sampleText, "\n"), sampleText, "", " ", "a", "  a", "\n\nb", "x  ", "'", "'s", " 's")
	for _, s := range texts {
		for range 2 { // the second time from the cache
			if got, want := he.Encode(nil, []byte(s)), re.Encode(nil, []byte(s)); !reflect.DeepEqual(got, want) {
				t.Fatalf("%q:\n hf   %v\n gpt2 %v", s, got, want)
			}
		}
	}
	// Added tokens in the text are matched, as tokenizers' encode does.
	if got := he.Encode(nil, []byte("a<|endoftext|>b")); len(got) != 3 || got[1] != 50256 {
		t.Errorf("added token: %v", got)
	}
}

func TestHFRefused(t *testing.T) {
	base := func() map[string]any {
		vocab := map[string]int{}
		for i, c := range byteChars() {
			vocab[c] = i
		}
		return map[string]any{
			"added_tokens":  []map[string]any{{"id": 256, "content": "<|endoftext|>"}},
			"pre_tokenizer": map[string]any{"type": "ByteLevel", "use_regex": true},
			"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
		}
	}
	for _, c := range []struct {
		change func(m map[string]any)
		want   string
	}{
		{func(m map[string]any) {}, ""},
		{func(m map[string]any) { m["model"].(map[string]any)["type"] = "WordPiece" }, "only BPE"},
		{func(m map[string]any) { m["normalizer"] = map[string]any{"type": "NFC"} }, "normalizer"},
		{func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Whitespace"} }, "only ByteLevel"},
		{func(m map[string]any) { m["pre_tokenizer"].(map[string]any)["add_prefix_space"] = true }, "add_prefix_space"},
		{func(m map[string]any) { m["added_tokens"] = []any{} }, "no end-of-text token"},
		{func(m map[string]any) { m["model"].(map[string]any)["merges"] = []string{"a bc"} }, "merges[0]"},
		{func(m map[string]any) { delete(m["model"].(map[string]any)["vocab"].(map[string]int), "A") }, "no token for byte 65"},
	} {
		m := base()
		c.change(m)
		js, _ := json.Marshal(m)
		_, err := parseHF(js)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("want %q, got %v", c.want, err)
		}
	}
}

// TestSplitGPT2 checks pre-tokens against the pattern by hand.
func TestSplitGPT2(t *testing.T) {
	for in, want := range map[string][]string{
		"Hello world":     {"Hello", " world"},
		"it's  a\n\nb":    {"it", "'s", " ", " a", "\n", "\n", "b"},
		"x   \t y":        {"x", "   \t", " y"},
		"end   ":          {"end", "   "},
		"a1b2 !!?":        {"a", "1", "b", "2", " !!?"},
		" 東京 1٢":          {" 東京", " 1٢"},
		"''s\xffx":        {"''", "s", "\xff", "x"},
		"\u00a0word":      {"\u00a0", "word"},
		"ab\u00a0\u00a0c": {"ab", "\u00a0", "\u00a0", "c"},
	} {
		var got []string
		splitGPT2([]byte(in), func(p []byte) { got = append(got, string(p)) })
		if !reflect.DeepEqual(got, want) {
			t.Errorf("split(%q) = %q, want %q", in, got, want)
		}
	}
}

// BenchmarkGPT2 encodes 1 MB of mixed text with this package's BPE and
// with the library's encoder.
func BenchmarkGPT2(b *testing.B) {
	text := []byte(strings.ToValidUTF8(randomText(1<<20, 7), "\uFFFD"))
	own, _ := Open("gpt2")
	lib, _ := newTiktoken("gpt2", tiktoken.R50kBase, 50256, 50257)
	for _, c := range []struct {
		name string
		tk   Tokenizer
	}{{"own", own}, {"tiktoken-go", lib}} {
		b.Run(c.name, func(b *testing.B) {
			e := c.tk.NewEncoder()
			b.SetBytes(int64(len(text)))
			for range b.N {
				e.Encode(nil, text)
			}
		})
	}
}

// randomText mixes ASCII words, digits, punctuation, contractions, runs of
// every kind of whitespace and characters of several scripts.
func randomText(n int, seed uint64) string {
	pieces := []string{"the", "The", "of", "and", "tokenization", "x", "Zürich", "naïve", "東京", "データ", "Привет", "ελληνικά",
		"مرحبا", "🙂", "—", "123", "4567", "3.14", "'s", "'t", "'re", "'ll", "'d", "'m", "'ve", "'S", "''", "...", "!?", "(", ")", "\"",
		" ", "  ", "   ", "\n", "\n\n", "\t", " \n", "\r\n", "\u00a0", "\u3000", "\xff", "a\xe2\x82"}
	var b strings.Builder
	x := seed
	for b.Len() < n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b.WriteString(pieces[x%uint64(len(pieces))])
		if x%3 == 0 {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// TestGPT2MatchesTiktoken: gpt2 through this package's BPE (merges derived
// from tiktoken's ranks) gives the library's ids on mixed text, valid UTF-8
// or not (the library replaces invalid bytes with U+FFFD first; so does the
// reference here).
func TestGPT2MatchesTiktoken(t *testing.T) {
	tk, err := Open("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := newTiktoken("gpt2", tiktoken.R50kBase, 50256, 50257)
	if err != nil {
		t.Fatal(err)
	}
	e, r := tk.NewEncoder(), ref.NewEncoder()
	for seed := range uint64(20) {
		s := strings.ToValidUTF8(randomText(20000, seed+1), "\uFFFD")
		got, want := e.Encode(nil, []byte(s)), r.Encode(nil, []byte(s))
		if !reflect.DeepEqual(got, want) {
			i := 0
			for i < min(len(got), len(want)) && got[i] == want[i] {
				i++
			}
			t.Fatalf("seed %d: ids differ at %d of %d/%d", seed, i, len(got), len(want))
		}
	}
}
