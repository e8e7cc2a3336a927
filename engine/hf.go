package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// The Hugging Face side of the families: config.json and the names and
// layouts of tensors in external checkpoints. A family describes itself
// (hfArchitecture, hfSettings, hfConfig, layouts); the loader
// (pretrained.go) and the exporter (export_hf.go) are the same code for
// every family.

// HFConfigFile is the name of a Hugging Face model directory's config.
const HFConfigFile = "config.json"

// extTensor is one parameter of a model as an external checkpoint
// stores it.
type extTensor struct {
	Name string // the checkpoint's name
	// Aliases are other names the loader accepts for it (GPT-2 saved
	// from GPT2Model has no "transformer." prefix).
	Aliases []string
	Shape   []int // the checkpoint's shape
	Layer   int   // the model layer whose parameter block holds it
	Param   ParamSpec
	// Transpose: the checkpoint holds the (in, out) transpose of spill's
	// (out, in) matrix (GPT-2's Conv1D).
	Transpose bool
}

// extLayout is a family's tensors in one checkpoint format.
type extLayout struct {
	Format  string // FormatHF or FormatNanoGPT
	Tensors []extTensor
	// Tied maps the names of copies of a tied parameter (a tied LM head's
	// lm_head.weight) to the name of the tensor they copy. A loader takes
	// them as optional and checks that they are equal to it; the HF
	// export leaves them out, as save_pretrained does.
	Tied map[string]string
	// Buffer reports names that are no parameters but buffers some
	// versions of transformers or nanoGPT saved (GPT-2's causal-mask
	// attn.bias, Llama's rotary inv_freq): the loader skips them.
	Buffer func(name string) bool
}

// paramLayout lists every parameter of m under its spill name, in spill's
// layout, with rename and transpose deciding the exceptions; the base of
// the families' layouts.
func paramLayout(m *Model, format string, rename func(string) (string, []string), transpose func(ParamSpec) bool) extLayout {
	l := extLayout{Format: format, Tied: map[string]string{}, Buffer: func(string) bool { return false }}
	for i, layer := range m.Layers {
		for _, ps := range layer.Params() {
			name, aliases := ps.Name, []string(nil)
			if rename != nil {
				name, aliases = rename(ps.Name)
			}
			t := extTensor{Name: name, Aliases: aliases, Shape: append([]int(nil), ps.Shape...), Layer: i, Param: ps}
			if transpose != nil && len(ps.Shape) == 2 && transpose(ps) {
				t.Transpose = true
				t.Shape = []int{ps.Shape[1], ps.Shape[0]}
			}
			l.Tensors = append(l.Tensors, t)
		}
	}
	return l
}

// hfSetting is one shape setting that config.json determines: its
// config.json field, spill's setting (the TOML key; the flag is the key
// with '-' for '_') and the value (int, float64, bool or
// RoPEScalingConfig).
type hfSetting struct {
	field string
	key   string
	value any
}

// hfConfigJSON is a parsed config.json whose getters record every
// problem, each naming its field.
type hfConfigJSON struct {
	path string
	m    map[string]json.RawMessage
	errs []error
}

// readHFConfig reads and parses path (a config.json).
func readHFConfig(path string) (*hfConfigJSON, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object: %w", path, err)
	}
	return &hfConfigJSON{path: path, m: m}, nil
}

// raw is field's value, nil when absent or null.
func (j *hfConfigJSON) raw(field string) json.RawMessage {
	v := j.m[field]
	if len(v) == 0 || string(v) == "null" {
		return nil
	}
	return v
}

func (j *hfConfigJSON) fail(field, format string, args ...any) {
	j.errs = append(j.errs, fmt.Errorf("%s: %s: %s", j.path, field, fmt.Sprintf(format, args...)))
}

// get decodes field into v; absent (or null) returns false, leaving v.
func (j *hfConfigJSON) get(field string, v any) bool {
	r := j.raw(field)
	if r == nil {
		return false
	}
	if err := json.Unmarshal(r, v); err != nil {
		j.fail(field, "%s is not a %T", r, v)
		return false
	}
	return true
}

// positiveInt is a required positive integer field (the first of names
// present: GPT-2's n_positions was once n_ctx).
func (j *hfConfigJSON) positiveInt(names ...string) (int, string) {
	for _, f := range names {
		var f64 float64
		if !j.get(f, &f64) {
			continue
		}
		if f64 != math.Trunc(f64) || f64 <= 0 || f64 > math.MaxInt32 {
			j.fail(f, "%v must be a positive integer", f64)
			return 0, f
		}
		return int(f64), f
	}
	j.fail(names[0], "missing")
	return 0, names[0]
}

// intOr is an optional integer field.
func (j *hfConfigJSON) intOr(field string, def int) int {
	var f64 float64
	if !j.get(field, &f64) {
		return def
	}
	if f64 != math.Trunc(f64) || f64 <= 0 || f64 > math.MaxInt32 {
		j.fail(field, "%v must be a positive integer", f64)
		return def
	}
	return int(f64)
}

func (j *hfConfigJSON) floatOr(field string, def float64) float64 {
	v := def
	j.get(field, &v)
	return v
}

func (j *hfConfigJSON) boolOr(field string, def bool) bool {
	v := def
	j.get(field, &v)
	return v
}

func (j *hfConfigJSON) stringOr(field, def string) string {
	v := def
	j.get(field, &v)
	return v
}

// want records a problem unless field (default def) is one of ok: spill
// does not implement the other values.
func (j *hfConfigJSON) want(field string, def any, ok ...any) {
	var v any = def
	if r := j.raw(field); r != nil {
		if err := json.Unmarshal(r, &v); err != nil {
			j.fail(field, "bad value %s", r)
			return
		}
	}
	for _, o := range ok {
		if fmt.Sprint(v) == fmt.Sprint(o) {
			return
		}
	}
	j.fail(field, "%v is not supported by spill (want %v)", v, ok[0])
}

func (j *hfConfigJSON) err() error { return errors.Join(j.errs...) }

// hfFamily finds the family of a config.json from its architectures
// (else model_type).
func hfFamily(j *hfConfigJSON) (Family, error) {
	var archs []string
	j.get("architectures", &archs)
	mt := j.stringOr("model_type", "")
	var known []string
	for _, f := range families {
		a, t := f.hfArchitecture()
		if a == "" {
			continue
		}
		known = append(known, a)
		for _, x := range archs {
			if x == a {
				return f, nil
			}
		}
		if len(archs) == 0 && mt == t {
			return f, nil
		}
	}
	if len(j.errs) > 0 {
		return nil, j.err()
	}
	return nil, fmt.Errorf("%s: architectures %q (model_type %q) is not a model spill trains (want one of %s)",
		j.path, archs, mt, strings.Join(known, ", "))
}

// writeJSONFile writes v as indented JSON to path atomically.
func writeJSONFile(path string, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	return WriteFileAtomic(path, func(w io.Writer) error {
		_, err := w.Write(buf.Bytes())
		return err
	})
}

// hfConfigPath is the config.json of a directory, "" if it has none.
func hfConfigPath(dir string) string {
	p := filepath.Join(dir, HFConfigFile)
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		return p
	}
	return ""
}
