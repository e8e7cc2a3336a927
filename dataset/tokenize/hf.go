package tokenize

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// A Hugging Face tokenizer.json holds the whole tokenizer pipeline. This
// reader takes the byte-level BPE tokenizers (GPT-2's, RoBERTa's, and what
// tokenizers.ByteLevelBPETokenizer trains):
//
//	normalizer     null
//	pre_tokenizer  ByteLevel with use_regex (GPT-2's pattern, see splitGPT2)
//	               and add_prefix_space false, alone or as the only member
//	               of a Sequence
//	model          BPE without dropout, byte_fallback, continuing_subword_prefix
//	               or end_of_word_suffix; merges as "a b" strings or [a, b] pairs
//	added_tokens   matched in the text before pre-tokenization, as
//	               Tokenizer.encode does
//
// Anything else is refused with the field named. The post-processor and the
// decoder do not change the ids of Encode without special tokens.

// hfFile is the part of tokenizer.json that is read.
type hfFile struct {
	AddedTokens []struct {
		ID      int    `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer   json.RawMessage `json:"normalizer"`
	PreTokenizer json.RawMessage `json:"pre_tokenizer"`
	Model        struct {
		Type                    string            `json:"type"`
		Dropout                 *float64          `json:"dropout"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		ByteFallback            bool              `json:"byte_fallback"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		Vocab                   map[string]int    `json:"vocab"`
		Merges                  []json.RawMessage `json:"merges"`
	} `json:"model"`
}

type hfPreTokenizer struct {
	Type           string           `json:"type"`
	AddPrefixSpace bool             `json:"add_prefix_space"`
	UseRegex       *bool            `json:"use_regex"`
	PreTokenizers  []hfPreTokenizer `json:"pretokenizers"`
}

// hfTokenizer is a byte-level BPE read from a tokenizer.json.
type hfTokenizer struct {
	name         string
	vocab        int
	eot          uint32
	byteID       [256]int32        // id of each byte's symbol
	merges       map[uint64]merge  // (left id, right id) -> rank and merged id
	whole        map[string]uint32 // ignore_merges: pre-tokens that are tokens
	ignoreMerges bool
	added        []addedToken // longest first
}

type merge struct {
	rank int32
	id   int32
}

type addedToken struct {
	text []byte
	id   uint32
}

// eotNames are the added tokens taken as end-of-text, in order of preference.
var eotNames = []string{"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]"}

// OpenHF reads a Hugging Face tokenizer.json (see the comment above for
// what it accepts). Its Name is "hf:FILE@sha256:PREFIX".
func OpenHF(path string) (Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parseHF(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	sum := sha256.Sum256(data)
	t.name = "hf:" + filepath.Base(path) + "@sha256:" + hex.EncodeToString(sum[:6])
	return t, nil
}

func parseHF(data []byte) (*hfTokenizer, error) {
	var f hfFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %v", err)
	}
	if n := bytes.TrimSpace(f.Normalizer); len(n) > 0 && string(n) != "null" {
		return nil, fmt.Errorf("normalizer %s: only tokenizers without a normalizer are supported", clip(n))
	}
	if err := checkPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	m := &f.Model
	switch {
	case m.Type != "BPE":
		return nil, fmt.Errorf("model type %q: only BPE is supported", m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, errors.New("model.dropout: BPE dropout is not supported")
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, errors.New("model.continuing_subword_prefix: not supported")
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, errors.New("model.end_of_word_suffix: not supported")
	case m.ByteFallback:
		return nil, errors.New("model.byte_fallback: not supported (byte-level BPE needs none)")
	case len(m.Vocab) == 0:
		return nil, errors.New("model.vocab is empty")
	}
	t := &hfTokenizer{merges: make(map[uint64]merge, len(m.Merges)), ignoreMerges: m.IgnoreMerges}
	maxID := -1
	for tok, id := range m.Vocab {
		if id < 0 || id >= 1<<31-1 {
			return nil, fmt.Errorf("model.vocab: token %q has id %d", tok, id)
		}
		maxID = max(maxID, id)
	}
	for i, b := range byteChars() {
		id, ok := m.Vocab[b]
		if !ok {
			return nil, fmt.Errorf("model.vocab has no token for byte %d (%q): not a byte-level BPE", i, b)
		}
		t.byteID[i] = int32(id)
	}
	for r, raw := range m.Merges {
		a, b, err := parseMerge(raw)
		if err != nil {
			return nil, fmt.Errorf("model.merges[%d]: %v", r, err)
		}
		ia, oka := m.Vocab[a]
		ib, okb := m.Vocab[b]
		im, okm := m.Vocab[a+b]
		if !oka || !okb || !okm {
			return nil, fmt.Errorf("model.merges[%d]: %q + %q: a part or the merged token is not in model.vocab", r, a, b)
		}
		key := uint64(ia)<<32 | uint64(ib)
		if _, dup := t.merges[key]; !dup {
			t.merges[key] = merge{rank: int32(r), id: int32(im)}
		}
	}
	if m.IgnoreMerges {
		t.whole = make(map[string]uint32, len(m.Vocab))
		for tok, id := range m.Vocab {
			t.whole[tok] = uint32(id)
		}
	}
	t.eot = ^uint32(0)
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID >= 1<<31-1 || a.Content == "" {
			return nil, fmt.Errorf("added_tokens: bad token %q (id %d)", a.Content, a.ID)
		}
		maxID = max(maxID, a.ID)
		t.added = append(t.added, addedToken{text: []byte(a.Content), id: uint32(a.ID)})
	}
	sort.SliceStable(t.added, func(i, j int) bool { return len(t.added[i].text) > len(t.added[j].text) })
	for _, name := range eotNames {
		if id, ok := t.addedID(name); ok {
			t.eot = id
			break
		}
	}
	if t.eot == ^uint32(0) {
		return nil, fmt.Errorf("no end-of-text token among added_tokens (want one of %s) to separate documents", strings.Join(eotNames, ", "))
	}
	t.vocab = maxID + 1
	return t, nil
}

func (t *hfTokenizer) addedID(content string) (uint32, bool) {
	for _, a := range t.added {
		if string(a.text) == content {
			return a.id, true
		}
	}
	return 0, false
}

func clip(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}

// checkPreTokenizer accepts ByteLevel(use_regex, no prefix space), alone
// or as the one member of a Sequence.
func checkPreTokenizer(raw json.RawMessage) error {
	var p hfPreTokenizer
	if err := json.Unmarshal(raw, &p); err != nil || len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return errors.New("pre_tokenizer: want ByteLevel (a byte-level BPE tokenizer)")
	}
	if p.Type == "Sequence" && len(p.PreTokenizers) == 1 {
		p = p.PreTokenizers[0]
	}
	switch {
	case p.Type != "ByteLevel":
		return fmt.Errorf("pre_tokenizer %s: only ByteLevel is supported", clip(raw))
	case p.UseRegex != nil && !*p.UseRegex:
		return errors.New("pre_tokenizer ByteLevel with use_regex false: not supported")
	case p.AddPrefixSpace:
		return errors.New("pre_tokenizer ByteLevel with add_prefix_space true: not supported")
	}
	return nil
}

// parseMerge reads one merge: "a b" or ["a", "b"].
func parseMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		a, b, ok := strings.Cut(s, " ")
		if !ok || a == "" || b == "" || strings.Contains(b, " ") {
			return "", "", fmt.Errorf("%q: want two tokens separated by one space", s)
		}
		return a, b, nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("%s: want \"a b\" or [\"a\", \"b\"]", clip(raw))
	}
	return pair[0], pair[1], nil
}

// byteChars returns GPT-2's byte-to-unicode map: the printable bytes stand
// for themselves, the others for the characters from U+0100 on, in order.
func byteChars() [256]string {
	var m [256]string
	n := 0
	for b := range 256 {
		if '!' <= b && b <= '~' || 0xA1 <= b && b <= 0xAC || 0xAE <= b && b <= 0xFF {
			m[b] = string(rune(b))
		} else {
			m[b] = string(rune(256 + n))
			n++
		}
	}
	return m
}

func (t *hfTokenizer) Name() string { return t.name }
func (t *hfTokenizer) Vocab() int   { return t.vocab }
func (t *hfTokenizer) EOT() uint32  { return t.eot }

// maxCache bounds an encoder's cache of pre-token encodings.
const maxCache = 1 << 16

func (t *hfTokenizer) NewEncoder() Encoder {
	return &hfEncoder{t: t, cache: make(map[string][]uint32)}
}

// hfEncoder encodes with a cache of the pre-tokens it has seen (reset when
// it holds maxCache of them, so memory stays bounded).
type hfEncoder struct {
	t     *hfTokenizer
	cache map[string][]uint32
	syms  []int32
	dst   []uint32
}

func (e *hfEncoder) Encode(dst []uint32, text []byte) []uint32 {
	e.dst = dst
	for len(text) > 0 {
		at, tok := e.t.nextAdded(text)
		splitGPT2(text[:at], e.piece)
		if tok == nil {
			break
		}
		e.dst = append(e.dst, tok.id)
		text = text[at+len(tok.text):]
	}
	dst, e.dst = e.dst, nil
	return dst
}

// nextAdded finds the first added token in text (the longest at that
// offset); it returns len(text), nil when there is none.
func (t *hfTokenizer) nextAdded(text []byte) (int, *addedToken) {
	best, bestAt := -1, len(text)
	for i := range t.added {
		if at := bytes.Index(text[:min(len(text), bestAt+len(t.added[i].text))], t.added[i].text); at >= 0 && at < bestAt {
			best, bestAt = i, at
		}
	}
	if best < 0 {
		return len(text), nil
	}
	return bestAt, &t.added[best]
}

// piece encodes one pre-token with BPE.
func (e *hfEncoder) piece(p []byte) {
	if ids, ok := e.cache[string(p)]; ok {
		e.dst = append(e.dst, ids...)
		return
	}
	start := len(e.dst)
	e.dst = e.t.bpe(e.dst, p, &e.syms)
	if len(e.cache) >= maxCache {
		clear(e.cache)
	}
	e.cache[string(p)] = append([]uint32(nil), e.dst[start:]...)
}

// bpe appends the BPE ids of the pre-token p: start from the bytes'
// symbols and merge the adjacent pair of lowest rank (leftmost first) until
// no pair merges.
func (t *hfTokenizer) bpe(dst []uint32, p []byte, scratch *[]int32) []uint32 {
	if t.ignoreMerges {
		var sb strings.Builder
		chars := byteChars()
		for _, b := range p {
			sb.WriteString(chars[b])
		}
		if id, ok := t.whole[sb.String()]; ok {
			return append(dst, id)
		}
	}
	syms := (*scratch)[:0]
	for _, b := range p {
		syms = append(syms, t.byteID[b])
	}
	for len(syms) > 1 {
		bestRank, bestAt := int32(-1), -1
		var bestID int32
		for i := 0; i+1 < len(syms); i++ {
			if m, ok := t.merges[uint64(uint32(syms[i]))<<32|uint64(uint32(syms[i+1]))]; ok && (bestAt < 0 || m.rank < bestRank) {
				bestRank, bestAt, bestID = m.rank, i, m.id
			}
		}
		if bestAt < 0 {
			break
		}
		syms[bestAt] = bestID
		syms = append(syms[:bestAt+1], syms[bestAt+2:]...)
	}
	for _, s := range syms {
		dst = append(dst, uint32(s))
	}
	*scratch = syms
	return dst
}
