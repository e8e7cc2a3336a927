package ingest

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/spill-ml/spill/dataset"
)

// emitBufSize is the size of the emitter's staging buffer: converted samples are
// handed to the writer in pieces of about this size.
const emitBufSize = 1 << 20

// emitter converts values into the output dataset's little-endian layout and hands
// them to the writer in large pieces. It is shared by all inputs of one conversion, so
// the byte-level tokenizer's document separators span file boundaries.
type emitter struct {
	w      io.Writer
	file   string // input being converted, for error messages
	wide   bool   // tokens stored as uint32
	limit  uint64 // tokens: largest allowed value
	vocab  int    // tokens: the schema's vocab size, 0 = unknown
	hint   string // tokens: where vocab came from, for the range error
	buf    []byte
	tokens int64 // tokens emitted
	docs   int64 // documents emitted by the byte-level tokenizer

	recSize int   // records: bytes per record
	records int64 // records emitted

	tok *tokPipe // text through a tokenizer other than the byte-level one; nil = bytes
}

func newEmitter(w io.Writer, s dataset.Schema, vocab int) *emitter {
	e := &emitter{w: w, buf: make([]byte, 0, emitBufSize), vocab: s.VocabSize}
	if s.Kind == dataset.KindTokens {
		e.wide = s.TokenDType == "uint32"
		e.limit = 1<<16 - 1
		if e.wide {
			e.limit = 1<<32 - 1
		}
		if s.VocabSize > 0 {
			e.limit = uint64(s.VocabSize) - 1
		}
	} else {
		e.recSize = s.SampleSize()
	}
	return e
}

// flush hands the staged bytes to the writer. It is the emitter's cancellation point.
func (e *emitter) flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(e.buf) == 0 {
		return nil
	}
	_, err := e.w.Write(e.buf)
	e.buf = e.buf[:0]
	return err
}

// full reports whether the staging buffer should be flushed before adding n bytes.
func (e *emitter) full(n int) bool { return len(e.buf)+n > cap(e.buf) }

func (e *emitter) rangeErr(v int64, elem int64) error {
	what := "uint16 tokens"
	if e.wide {
		what = "uint32 tokens"
	}
	if e.vocab > 0 {
		what = fmt.Sprintf("vocab size %d", e.vocab)
		if e.hint != "" {
			what += " (" + e.hint + ")"
		}
	}
	return fmt.Errorf("%s: element %d: token %d out of range for %s", e.file, elem, v, what)
}

// rawTokens16 emits little-endian uint16 tokens; p holds whole tokens. first is the
// file index of p's first token (for error messages). p is not retained.
func (e *emitter) rawTokens16(ctx context.Context, p []byte, first int64) error {
	n := len(p) / 2
	if e.limit < 1<<16-1 {
		for i := 0; i < n; i++ {
			if v := binary.LittleEndian.Uint16(p[2*i:]); uint64(v) > e.limit {
				return e.rangeErr(int64(v), first+int64(i))
			}
		}
	}
	e.tokens += int64(n)
	if !e.wide {
		// Same layout: hand p over without copying.
		if err := e.flush(ctx); err != nil {
			return err
		}
		_, err := e.w.Write(p)
		return err
	}
	for i := 0; i < n; i++ {
		if e.full(4) {
			if err := e.flush(ctx); err != nil {
				return err
			}
		}
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(binary.LittleEndian.Uint16(p[2*i:])))
	}
	return nil
}

// tokens emits token values after checking their range. first is the file index of
// vals[0] (for error messages).
func (e *emitter) tokenValues(ctx context.Context, vals []int64, first int64) error {
	for i, v := range vals {
		if v < 0 || uint64(v) > e.limit {
			return e.rangeErr(v, first+int64(i))
		}
		if e.full(4) {
			if err := e.flush(ctx); err != nil {
				return err
			}
		}
		if e.wide {
			e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(v))
		} else {
			e.buf = binary.LittleEndian.AppendUint16(e.buf, uint16(v))
		}
	}
	e.tokens += int64(len(vals))
	return nil
}

// tokenIDs emits the ids of a tokenizer after checking their range.
func (e *emitter) tokenIDs(ctx context.Context, ids []uint32) error {
	for _, v := range ids {
		if uint64(v) > e.limit {
			return fmt.Errorf("%s: tokenizer %s produced id %d, outside vocab size %d", e.file, e.tok.tk.Name(), v, e.vocab)
		}
		if e.full(4) {
			if err := e.flush(ctx); err != nil {
				return err
			}
		}
		if e.wide {
			e.buf = binary.LittleEndian.AppendUint32(e.buf, v)
		} else {
			e.buf = binary.LittleEndian.AppendUint16(e.buf, uint16(v))
		}
	}
	e.tokens += int64(len(ids))
	return nil
}

// endInput emits everything of the input converted so far: the tokenizer's
// pending text and the staged bytes.
func (e *emitter) endInput(ctx context.Context) error {
	if e.tok != nil {
		if err := e.tok.drain(ctx, func(ids []uint32) error { return e.tokenIDs(ctx, ids) }); err != nil {
			return err
		}
	}
	return e.flush(ctx)
}

// token emits one token that is known to be in range.
func (e *emitter) token(ctx context.Context, v uint32) error {
	if e.full(4) {
		if err := e.flush(ctx); err != nil {
			return err
		}
	}
	if e.wide {
		e.buf = binary.LittleEndian.AppendUint32(e.buf, v)
	} else {
		e.buf = binary.LittleEndian.AppendUint16(e.buf, uint16(v))
	}
	e.tokens++
	return nil
}

// beginDoc starts a document of the byte-level tokenizer: EOT separates it from the
// previous one, if any.
func (e *emitter) beginDoc(ctx context.Context) error {
	e.docs++
	if e.tok != nil {
		e.tok.beginDoc(e.docs == 1)
		return nil
	}
	if e.docs == 1 {
		return nil
	}
	return e.token(ctx, EOT)
}

// textBytes emits the byte-level tokens of text (part of the current document).
func (e *emitter) textBytes(ctx context.Context, text []byte) error {
	if e.tok != nil {
		return e.tok.text(ctx, text, func(ids []uint32) error { return e.tokenIDs(ctx, ids) })
	}
	size := 2
	if e.wide {
		size = 4
	}
	for len(text) > 0 {
		room := (cap(e.buf) - len(e.buf)) / size
		if room == 0 {
			if err := e.flush(ctx); err != nil {
				return err
			}
			continue
		}
		n := min(room, len(text))
		if e.wide {
			for _, b := range text[:n] {
				e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(b))
			}
		} else {
			for _, b := range text[:n] {
				e.buf = append(e.buf, b, 0)
			}
		}
		e.tokens += int64(n)
		text = text[n:]
	}
	return nil
}

// record emits one whole record of recSize bytes.
func (e *emitter) record(ctx context.Context, rec []byte) error {
	if len(rec) != e.recSize {
		return fmt.Errorf("%s: internal error: record of %d bytes, want %d", e.file, len(rec), e.recSize)
	}
	if e.full(len(rec)) {
		if err := e.flush(ctx); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, rec...)
	e.records++
	return nil
}
