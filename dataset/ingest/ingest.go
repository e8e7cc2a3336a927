// Package ingest converts common training-data files into spill datasets.
//
// Every input is streamed: memory stays bounded by a few fixed buffers (and, for
// line-oriented formats, the longest line; for Parquet, one page) whatever the
// size of the input. Supported inputs:
//
//   - bin: nanoGPT train.bin, raw little-endian uint16 tokens -> tokens dataset
//   - npy: 1-D integer arrays -> tokens; 2-D float or integer arrays (C or Fortran order) -> records
//   - jsonl: one JSON object per line, a string field tokenized -> tokens
//   - text: plain text files, tokenized, one document per file -> tokens
//   - csv: numeric columns, optional header -> records
//   - parquet: a string column (tokenized) -> tokens, or numeric columns -> records
//
// Text is byte-tokenized unless Options.Tokenizer names another tokenizer
// (package tokenize: gpt2, cl100k_base, o200k_base or a Hugging Face
// tokenizer.json), which runs on every CPU with bounded memory (tokpipe.go).
// The byte-level tokenizer maps each byte to the token of the same value and
// separates documents with EOT (256); its vocabulary has 257 tokens, stored
// as uint16.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/spill-ml/spill/dataset"

	"github.com/spill-ml/spill/dataset/tokenize"
	"github.com/spill-ml/spill/kernels"
	"math"
	"runtime"
)

// Format names an input file format.
type Format string

// Input formats.
const (
	FormatBin     Format = "bin"
	FormatNPY     Format = "npy"
	FormatJSONL   Format = "jsonl"
	FormatText    Format = "text"
	FormatCSV     Format = "csv"
	FormatParquet Format = "parquet"
)

// Formats lists the supported formats.
var Formats = []Format{FormatBin, FormatNPY, FormatJSONL, FormatText, FormatCSV, FormatParquet}

// Byte-level tokenizer constants.
const (
	EOT       = 256 // end-of-text token between documents
	ByteVocab = 257 // vocabulary size of the byte-level tokenizer
)

// GPT2Vocab is the vocabulary of the GPT-2 tokenizer, which a nanoGPT
// train.bin holds: a .bin converted without Options.Vocab records it.
const GPT2Vocab = 50257

// ParseFormat checks a --format value.
func ParseFormat(s string) (Format, error) {
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	if s == "txt" {
		return FormatText, nil
	}
	return "", fmt.Errorf("unknown format %q (want one of %s)", s, formatList())
}

func formatList() string {
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}

// DetectFormat guesses a file's format from its extension.
func DetectFormat(path string) (Format, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".bin":
		return FormatBin, nil
	case ".npy":
		return FormatNPY, nil
	case ".jsonl", ".ndjson":
		return FormatJSONL, nil
	case ".txt", ".text", ".md":
		return FormatText, nil
	case ".csv":
		return FormatCSV, nil
	case ".parquet", ".pq":
		return FormatParquet, nil
	}
	return "", fmt.Errorf("%s: cannot tell the format from the extension; pass --format (one of %s)", path, formatList())
}

// HeaderMode says whether the first CSV row holds column names.
type HeaderMode string

// CSV header modes.
const (
	HeaderAuto HeaderMode = "auto" // a header iff two or more fields of the first row (or all) are not numbers
	HeaderYes  HeaderMode = "yes"
	HeaderNo   HeaderMode = "no"
)

// Options configure a conversion. The zero value of every field selects its default.
type Options struct {
	// Format of every input; "" detects each file's format from its extension.
	Format Format
	// SeqLen is the tokens per sample of a tokens dataset (a sample holds SeqLen+1 tokens).
	// Default 1024.
	SeqLen int
	// Vocab is the vocabulary size recorded in the schema; 0 = unknown (the byte-level
	// tokenizer records 257). When set, every token is checked to be below it.
	Vocab int
	// TokenDType is the stored token type, "uint16" or "uint32". Default: uint16 for
	// bin, text, jsonl, parquet text and npy arrays of 1- and 2-byte integers; uint32
	// for wider npy integers unless Vocab fits uint16.
	TokenDType string
	// Field is the JSONL field or Parquet column holding text. Default "text".
	Field string
	// LabelCol selects the label column of records by name or 0-based index
	// (negative counts from the end). Default: the last column.
	LabelCol string
	// LabelType is the stored label type, "float32" or "int32". Default: int32 for
	// int32 npy arrays, float32 otherwise.
	LabelType string
	// Header says whether CSV files start with a header row. Default HeaderAuto.
	Header HeaderMode
	// Writer configures the output; its Schema is filled in by Convert.
	Writer dataset.WriterOptions
	// BytesRead, if not nil, is advanced as input bytes are consumed (for progress).
	BytesRead *atomic.Int64
	// Tokenizer turns the text of text, JSONL and Parquet text inputs into
	// tokens; nil is the byte-level tokenizer. Its name and vocabulary go
	// into the schema (Vocab, when set, must be at least its vocabulary).
	Tokenizer tokenize.Tokenizer
	// TokenizerWorkers is the number of goroutines that tokenize; 0 = one
	// per CPU (GOMAXPROCS).
	TokenizerWorkers int
	// Warn, if not nil, receives messages the user should see that do not
	// stop the conversion (a stale temporary directory removed, ...).
	Warn func(msg string)

	labelIdx int // label index resolved by the first records input, plus 1; 0 = none yet
	// classes maps string labels to class ids, in order of first
	// appearance over all inputs (classNames); nil when labels are numbers.
	classes    map[string]int32
	classNames []string
}

// classID returns the class id of a string label, adding it if new.
func (o *Options) classID(name string) (int32, error) {
	if id, ok := o.classes[name]; ok {
		return id, nil
	}
	if len(o.classNames) >= math.MaxInt32 {
		return 0, errors.New("too many label classes")
	}
	id := int32(len(o.classNames))
	o.classes[name] = id
	o.classNames = append(o.classNames, name)
	return id, nil
}

func (o *Options) setDefaults() {
	if o.SeqLen == 0 {
		o.SeqLen = 1024
	}
	if o.Field == "" {
		o.Field = "text"
	}
	if o.Header == "" {
		o.Header = HeaderAuto
	}
	if o.BytesRead == nil {
		o.BytesRead = new(atomic.Int64)
	}
}

func (o *Options) tokenizerWorkers() int {
	if o.TokenizerWorkers > 0 {
		return o.TokenizerWorkers
	}
	return runtime.GOMAXPROCS(0)
}

// textSchema is the natural schema of tokenized text.
func (o *Options) textSchema() dataset.Schema {
	tk := o.Tokenizer
	if tk == nil {
		return byteTokensSchema()
	}
	dt := "uint16"
	if tk.Vocab() > 1<<16 {
		dt = "uint32"
	}
	return dataset.Schema{Kind: dataset.KindTokens, TokenDType: dt, VocabSize: tk.Vocab(), Tokenizer: tk.Name()}
}

func (o *Options) warn(msg string) {
	if o.Warn != nil {
		o.Warn(msg)
	}
}

func (o *Options) validate() error {
	var errs []error
	if o.SeqLen < 1 {
		errs = append(errs, fmt.Errorf("seq-len %d: must be at least 1", o.SeqLen))
	}
	if o.Vocab < 0 {
		errs = append(errs, fmt.Errorf("vocab %d: must not be negative", o.Vocab))
	}
	switch o.TokenDType {
	case "", "uint16", "uint32":
	default:
		errs = append(errs, fmt.Errorf("token dtype %q: want uint16 or uint32", o.TokenDType))
	}
	if o.TokenDType == "uint16" && o.Vocab > 1<<16 {
		errs = append(errs, fmt.Errorf("vocab %d does not fit uint16 tokens", o.Vocab))
	}
	switch o.LabelType {
	case "", "float32", "int32":
	default:
		errs = append(errs, fmt.Errorf("label type %q: want float32 or int32", o.LabelType))
	}
	switch o.Header {
	case HeaderAuto, HeaderYes, HeaderNo:
	default:
		errs = append(errs, fmt.Errorf("header %q: want auto, yes or no", o.Header))
	}
	return errors.Join(errs...)
}

// source is one opened input file. Its header has been read, so its schema is known.
type source interface {
	// schema is the dataset layout the file converts to. For tokens it holds Kind and
	// the token dtype the file naturally needs; for records every field.
	schema() dataset.Schema
	// run streams the file's samples into e.
	run(ctx context.Context, e *emitter) error
	Close() error
}

// Convert reads inputs in order, concatenated, and writes them as one dataset at out.
// All inputs must convert to the same schema. On any error, including cancellation of
// ctx, nothing is left at out.
func Convert(ctx context.Context, out string, inputs []string, opts Options) (*dataset.Manifest, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if len(inputs) == 0 {
		return nil, errors.New("no input files")
	}
	formats := make([]Format, len(inputs))
	for i, in := range inputs {
		f := opts.Format
		if f == "" {
			var err error
			if f, err = DetectFormat(in); err != nil {
				return nil, err
			}
		}
		formats[i] = f
	}

	first, err := openSource(inputs[0], formats[0], &opts)
	if err != nil {
		return nil, err
	}
	natural := first.schema()
	if f := formats[0]; (f == FormatBin || f == FormatNPY) && natural.Kind == dataset.KindTokens {
		// Token ids made elsewhere: --tokenizer names what made them.
		switch {
		case opts.Tokenizer != nil:
			natural.VocabSize, natural.Tokenizer = opts.Tokenizer.Vocab(), opts.Tokenizer.Name()
		case f == FormatBin && opts.Vocab == 0:
			natural.VocabSize, natural.Tokenizer = GPT2Vocab, "gpt2"
		}
	}
	schema, err := finalSchema(natural, &opts)
	if err != nil {
		first.Close()
		return nil, fmt.Errorf("%s: %w", inputs[0], err)
	}
	made, err := makeParents(out)
	if err != nil {
		first.Close()
		return nil, err
	}
	wopts := opts.Writer
	wopts.Schema = schema
	w, err := dataset.Create(ctx, out, wopts)
	if err != nil {
		first.Close()
		removeDirs(made)
		return nil, err
	}
	for _, st := range w.StaleTemps() {
		opts.warn(fmt.Sprintf("removed %s (%s), left by an interrupted conversion to %s", st.Path, kernels.FormatBytes(st.Bytes), out))
	}
	m, err := convertAll(ctx, w, first, inputs, formats, schema, &opts)
	if err != nil {
		w.Abort()
		removeDirs(made)
		return nil, err
	}
	return m, nil
}

// makeParents creates the missing parent directories of out and returns them,
// deepest first, so that a failed conversion can remove them again.
func makeParents(out string) ([]string, error) {
	var missing []string
	for p := filepath.Dir(filepath.Clean(out)); ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil || !errors.Is(err, os.ErrNotExist) {
			break
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(missing[0], 0o755); err != nil {
		return nil, err
	}
	return missing, nil
}

// removeDirs removes the (empty) directories made by makeParents.
func removeDirs(dirs []string) {
	for _, d := range dirs {
		os.Remove(d)
	}
}

func convertAll(ctx context.Context, w *dataset.Writer, first source, inputs []string, formats []Format, schema dataset.Schema, opts *Options) (*dataset.Manifest, error) {
	e := newEmitter(w, schema, opts.Vocab)
	if tk := opts.Tokenizer; tk != nil && tk.Name() != "byte" && formats[0] != FormatBin && formats[0] != FormatNPY {
		e.tok = newTokPipe(tk, opts.tokenizerWorkers())
	}
	if formats[0] == FormatBin && opts.Vocab == 0 {
		e.hint = "the GPT-2 vocabulary that a nanoGPT .bin holds; pass --vocab with the size of your tokenizer's"
	}
	for i, in := range inputs {
		src := first
		if i > 0 {
			var err error
			if src, err = openSource(in, formats[i], opts); err != nil {
				return nil, err
			}
			if err := compatible(schema, src.schema()); err != nil {
				src.Close()
				return nil, fmt.Errorf("%s: %w (first input %s)", in, err, inputs[0])
			}
		}
		e.file = in
		err := src.run(ctx, e)
		if err == nil {
			err = e.endInput(ctx)
		}
		src.Close()
		if err != nil {
			return nil, err
		}
	}
	if schema.Kind == dataset.KindTokens {
		if need := int64(schema.SeqLen) + 1; e.tokens < need {
			return nil, fmt.Errorf("inputs hold %d tokens, fewer than one sample (seq-len+1 = %d)", e.tokens, need)
		}
	} else if e.records == 0 {
		return nil, errors.New("inputs hold no records")
	}
	if opts.classes != nil {
		if err := w.SetLabelClasses(opts.classNames); err != nil {
			return nil, err
		}
	}
	return w.Commit(ctx)
}

// finalSchema completes a source's natural schema with the options.
func finalSchema(s dataset.Schema, o *Options) (dataset.Schema, error) {
	if s.Kind == dataset.KindTokens {
		s.SeqLen = o.SeqLen
		switch {
		case o.TokenDType != "":
			s.TokenDType = o.TokenDType
		case o.Vocab > 1<<16:
			s.TokenDType = "uint32"
		case o.Vocab > 0:
			s.TokenDType = "uint16"
		}
		if o.Vocab > 0 {
			if s.VocabSize > 0 && o.Vocab < s.VocabSize {
				return s, fmt.Errorf("vocab %d is smaller than the %s tokenizer's %d", o.Vocab, s.Tokenizer, s.VocabSize)
			}
			s.VocabSize = o.Vocab
		}
	}
	return s, s.Validate()
}

// compatible reports whether a later input's schema can be appended to a dataset of schema s.
func compatible(s, next dataset.Schema) error {
	if s.Kind != next.Kind {
		return fmt.Errorf("converts to a %s dataset, not %s", next.Kind, s.Kind)
	}
	if s.Kind == dataset.KindRecords {
		if s.Features != next.Features {
			return fmt.Errorf("has %d feature columns, want %d", next.Features, s.Features)
		}
		if s.FeatureDType != next.FeatureDType || s.LabelDType != next.LabelDType {
			return fmt.Errorf("has %s features and %s labels, want %s and %s",
				next.FeatureDType, next.LabelDType, s.FeatureDType, s.LabelDType)
		}
	}
	return nil
}

func openSource(path string, f Format, o *Options) (source, error) {
	switch f {
	case FormatBin:
		return openBin(path, o)
	case FormatNPY:
		return openNPY(path, o)
	case FormatJSONL:
		return openJSONL(path, o)
	case FormatText:
		return openText(path, o)
	case FormatCSV:
		return openCSV(path, o)
	case FormatParquet:
		return openParquet(path, o)
	}
	return nil, fmt.Errorf("%s: unknown format %q", path, f)
}

// countingReader counts the bytes read through it into n.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// openWith opens path and builds a source on it with build, closing the
// file if build fails.
func openWith[S source](path string, o *Options, build func(path string, f *os.File, size int64, o *Options) (S, error)) (source, error) {
	f, size, err := openFile(path)
	if err != nil {
		return nil, err
	}
	s, err := build(path, f, size, o)
	if err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// recordsSchema is the schema of float32 feature records whose columns are
// named by names (nil when the input has no header), with the column
// labelIdx as the label of dtype labelType ("" means float32).
func recordsSchema(names []string, ncols, labelIdx int, labelType string) dataset.Schema {
	if labelType == "" {
		labelType = "float32"
	}
	s := dataset.Schema{Kind: dataset.KindRecords, FeatureDType: "float32", Features: ncols - 1, LabelDType: labelType}
	for i, n := range names {
		if i == labelIdx {
			s.Label = n
		} else {
			s.Columns = append(s.Columns, n)
		}
	}
	return s
}

// openFile opens path and returns it with its size.
func openFile(path string) (*os.File, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%s: not a regular file", path)
	}
	return f, st.Size(), nil
}
