package ingest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spill-ml/spill/dataset"
)

// byteTokensSchema is the natural schema of byte-tokenized text.
func byteTokensSchema() dataset.Schema {
	return dataset.Schema{Kind: dataset.KindTokens, TokenDType: "uint16", VocabSize: ByteVocab, Tokenizer: "byte"}
}

// textSource byte-tokenizes a plain text file as one document.
type textSource struct {
	path string
	f    *os.File
	o    *Options
}

func openText(path string, o *Options) (source, error) {
	f, _, err := openFile(path)
	if err != nil {
		return nil, err
	}
	return &textSource{path: path, f: f, o: o}, nil
}

func (s *textSource) schema() dataset.Schema { return s.o.textSchema() }

func (s *textSource) Close() error { return s.f.Close() }

func (s *textSource) run(ctx context.Context, e *emitter) error {
	if err := e.beginDoc(ctx); err != nil {
		return err
	}
	r := countingReader{r: s.f, n: s.o.BytesRead}
	buf := make([]byte, 1<<20)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if err := e.textBytes(ctx, buf[:n]); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s.path, err)
		}
	}
}

// jsonlSource byte-tokenizes one string field of each line of a JSON Lines file;
// each line is a document. Blank lines are skipped.
type jsonlSource struct {
	path string
	f    *os.File
	o    *Options
}

func openJSONL(path string, o *Options) (source, error) {
	f, _, err := openFile(path)
	if err != nil {
		return nil, err
	}
	return &jsonlSource{path: path, f: f, o: o}, nil
}

func (s *jsonlSource) schema() dataset.Schema { return s.o.textSchema() }

func (s *jsonlSource) Close() error { return s.f.Close() }

func (s *jsonlSource) run(ctx context.Context, e *emitter) error {
	lr := newLineReader(countingReader{r: s.f, n: s.o.BytesRead})
	var obj map[string]json.RawMessage
	var text string
	for lineNo := 1; ; lineNo++ {
		line, err := lr.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s:%d: %w", s.path, lineNo, err)
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		clear(obj)
		if err := json.Unmarshal(line, &obj); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				return fmt.Errorf("%s:%d: want a JSON object, found %s", s.path, lineNo, te.Value)
			}
			return fmt.Errorf("%s:%d: malformed JSON: %v", s.path, lineNo, err)
		}
		raw, ok := obj[s.o.Field]
		if !ok {
			return fmt.Errorf("%s:%d: no field %q (use --field to choose the text field)", s.path, lineNo, s.o.Field)
		}
		if string(raw) == "null" {
			continue // no text: not a document (as a Parquet null)
		}
		if err := json.Unmarshal(raw, &text); err != nil {
			return fmt.Errorf("%s:%d: field %q is not a string", s.path, lineNo, s.o.Field)
		}
		if err := e.beginDoc(ctx); err != nil {
			return err
		}
		if err := e.textBytes(ctx, []byte(text)); err != nil {
			return err
		}
	}
}

// lineReader returns the lines of r without their newline, reusing its buffer:
// a line is valid until the next call.
type lineReader struct {
	r    *bufio.Reader
	long []byte
}

func newLineReader(r io.Reader) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 1<<20)}
}

func (l *lineReader) next() ([]byte, error) {
	line, err := l.r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		l.long = append(l.long[:0], line...)
		for err == bufio.ErrBufferFull {
			line, err = l.r.ReadSlice('\n')
			l.long = append(l.long, line...)
		}
		line = l.long
	}
	if err == io.EOF && len(line) > 0 {
		err = nil // last line without a newline
	}
	if err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(line, []byte("\n")), nil
}
