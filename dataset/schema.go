package dataset

import (
	"errors"
	"fmt"
)

// Kind is the sample kind of a dataset.
type Kind string

const (
	KindTokens  Kind = "tokens"  // token stream; sample i = tokens[i*SeqLen : i*SeqLen+SeqLen+1]
	KindRecords Kind = "records" // fixed-size records: Features values + 1 label
	KindBytes   Kind = "bytes"   // variable-length byte records, with an offset index
)

// Schema describes the samples of a dataset. It is stored in manifest.json.
type Schema struct {
	Kind         Kind     `json:"kind"`
	TokenDType   string   `json:"token_dtype,omitempty"`   // tokens: "uint16" | "uint32"
	SeqLen       int      `json:"seq_len,omitempty"`       // tokens: sample = SeqLen+1 tokens
	VocabSize    int      `json:"vocab_size,omitempty"`    // tokens: optional, 0 = unknown
	FeatureDType string   `json:"feature_dtype,omitempty"` // records: "float32" | "int32"
	Features     int      `json:"features,omitempty"`      // records: values per record
	LabelDType   string   `json:"label_dtype,omitempty"`   // records: "float32" | "int32" (label stored after features)
	Columns      []string `json:"columns,omitempty"`       // records: optional feature names
	Label        string   `json:"label,omitempty"`         // records: optional label name
	// LabelClasses names the classes of int32 labels converted from
	// strings (a CSV column such as iris's species): label i is
	// LabelClasses[i]. Empty when the labels were numbers.
	LabelClasses []string `json:"label_classes,omitempty"`
	// Tokenizer names the tokenizer that produced a tokens dataset
	// ("byte", "gpt2", "cl100k_base", "o200k_base", "hf:FILE"); "" =
	// unknown (token files made elsewhere).
	Tokenizer string `json:"tokenizer,omitempty"`
}

// maxSampleSize bounds fixed sample sizes (tokens and records) so that sizes fit in the
// 32-bit header fields and offsets arithmetic cannot overflow.
const maxSampleSize = 1 << 30

// Validate reports every problem of the schema at once, or nil.
func (s Schema) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch s.Kind {
	case KindTokens:
		if s.TokenDType != "uint16" && s.TokenDType != "uint32" {
			bad("token_dtype %q: want uint16 or uint32", s.TokenDType)
		}
		if s.SeqLen < 1 {
			bad("seq_len %d: must be at least 1", s.SeqLen)
		} else if int64(s.SeqLen)+1 > maxSampleSize/4 {
			bad("seq_len %d: too large", s.SeqLen)
		}
		if s.VocabSize < 0 {
			bad("vocab_size %d: must not be negative", s.VocabSize)
		} else if s.TokenDType == "uint16" && s.VocabSize > 1<<16 {
			bad("vocab_size %d does not fit token_dtype uint16", s.VocabSize)
		}
	case KindRecords:
		if s.FeatureDType != "float32" && s.FeatureDType != "int32" {
			bad("feature_dtype %q: want float32 or int32", s.FeatureDType)
		}
		if s.LabelDType != "float32" && s.LabelDType != "int32" {
			bad("label_dtype %q: want float32 or int32", s.LabelDType)
		}
		if s.Features < 1 {
			bad("features %d: must be at least 1", s.Features)
		} else if int64(s.Features) > maxSampleSize/4-1 {
			bad("features %d: too large", s.Features)
		}
		if len(s.Columns) != 0 && len(s.Columns) != s.Features {
			bad("%d column names for %d features", len(s.Columns), s.Features)
		}
		if len(s.LabelClasses) != 0 && s.LabelDType != "int32" {
			bad("label_classes with %s labels: class ids are int32", s.LabelDType)
		}
	case KindBytes:
	default:
		bad("kind %q: want tokens, records or bytes", s.Kind)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("dataset: invalid schema: %w", err)
	}
	return nil
}

// TokenSize is the byte size of one token (2 or 4) for token datasets, 0 otherwise.
func (s Schema) TokenSize() int {
	if s.Kind != KindTokens {
		return 0
	}
	if s.TokenDType == "uint32" {
		return 4
	}
	return 2
}

// SampleSize is the byte size of one sample for tokens ((SeqLen+1)*tokenSize) and records
// (Features*4 + 4); 0 for bytes.
func (s Schema) SampleSize() int {
	switch s.Kind {
	case KindTokens:
		return (s.SeqLen + 1) * s.TokenSize()
	case KindRecords:
		return s.Features*4 + 4
	}
	return 0
}

// stride is the byte distance between the starts of consecutive samples: SeqLen tokens for
// token streams (windows overlap by one token), SampleSize for records, 0 for bytes.
func (s Schema) stride() int {
	switch s.Kind {
	case KindTokens:
		return s.SeqLen * s.TokenSize()
	case KindRecords:
		return s.SampleSize()
	}
	return 0
}
