package tokenize

import (
	"unicode"
	"unicode/utf8"
)

// splitGPT2 calls piece for each pre-token of text under GPT-2's
// pre-tokenization pattern, which Hugging Face's ByteLevel pre-tokenizer
// (use_regex) applies:
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// It is written out by hand (a regexp engine would have to backtrack for
// the lookahead). The alternatives are tried in order at each position, as
// the regexp does; \s is Unicode White_Space (unicode.IsSpace), \p{L}
// unicode.IsLetter and \p{N} unicode.IsNumber. A byte that is not valid
// UTF-8 counts as neither space, letter nor number. The pieces cover text
// exactly, in order.
func splitGPT2(text []byte, piece func([]byte)) {
	for i := 0; i < len(text); {
		n := matchGPT2(text[i:])
		piece(text[i : i+n])
		i += n
	}
}

// rune classes of the pattern.
const (
	clsOther = iota
	clsSpace
	clsLetter
	clsNumber
)

// classAt returns the class of the rune at the start of b and its width.
func classAt(b []byte) (int, int) {
	c := b[0]
	if c < utf8.RuneSelf {
		switch {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
			return clsLetter, 1
		case '0' <= c && c <= '9':
			return clsNumber, 1
		case c == ' ' || '\t' <= c && c <= '\r':
			return clsSpace, 1
		}
		return clsOther, 1
	}
	r, w := utf8.DecodeRune(b)
	switch {
	case r == utf8.RuneError && w == 1:
		return clsOther, 1
	case unicode.IsLetter(r):
		return clsLetter, w
	case unicode.IsNumber(r):
		return clsNumber, w
	case unicode.IsSpace(r):
		return clsSpace, w
	}
	return clsOther, w
}

// run returns the length of the run of class cls at the start of b.
func run(b []byte, cls int) int {
	n := 0
	for n < len(b) {
		c, w := classAt(b[n:])
		if c != cls {
			break
		}
		n += w
	}
	return n
}

// matchGPT2 returns the length of the pre-token at the start of b (> 0).
func matchGPT2(b []byte) int {
	// 's|'t|'re|'ve|'m|'ll|'d
	if b[0] == '\'' && len(b) >= 2 {
		switch b[1] {
		case 's', 't', 'm', 'd':
			return 2
		case 'r':
			if len(b) >= 3 && b[2] == 'e' {
				return 3
			}
		case 'v':
			if len(b) >= 3 && b[2] == 'e' {
				return 3
			}
		case 'l':
			if len(b) >= 3 && b[2] == 'l' {
				return 3
			}
		}
	}
	// ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
	start := 0
	if b[0] == ' ' && len(b) >= 2 {
		start = 1
	}
	if start < len(b) {
		if cls, _ := classAt(b[start:]); cls != clsSpace {
			return start + run(b[start:], cls)
		}
	}
	// '\s+(?!\S)', then '\s+'
	n := run(b, clsSpace)
	if n == len(b) {
		return n // whitespace to the end
	}
	// The run is followed by a non-space: the lookahead holds only one
	// character back, if the run has more than one.
	_, lastW := lastRune(b[:n])
	if n > lastW {
		return n - lastW
	}
	return n
}

// lastRune returns the last rune's start offset and width in b (b holds
// whole runes of the space class, so its last rune decodes).
func lastRune(b []byte) (int, int) {
	_, w := utf8.DecodeLastRune(b)
	return len(b) - w, w
}
