package engine

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/edsrzf/mmap-go"

	"github.com/spill-ml/spill/kernels"
)

// Pretrained weights in (Config.InitFrom, spill train --init-from).
//
// PATH is a safetensors file or a Hugging Face model directory:
//
//	config.json                     optional: the family and shape
//	model.safetensors               one file, or
//	model.safetensors.index.json    {"weight_map": {tensor: shard file}} and
//	model-00001-of-0000N.safetensors ...  its shards
//
// ResolveInitFrom turns config.json into settings before the model is
// built. OpenPretrained maps the files (nothing is read yet), Bind checks
// every tensor's name, dtype (F32, BF16 or F16) and shape against the
// model, in the layout the family reads (extLayout), and reports every
// problem with the tensor and file at once, before anything is allocated
// for training; Trainer.LoadPretrained then converts the tensors to fp32,
// one layer at a time, straight from the mapped files into the layer's
// master weights: into the host copy the out-of-core trainer keeps, or
// through one layer-sized buffer for the resident one. The whole model is
// never held twice: the pages of a tensor are dropped from the mapping
// once it is converted.

// HFIndexFile is the index of a sharded Hugging Face checkpoint.
const HFIndexFile = "model.safetensors.index.json"

// HFWeightsFile is the one weights file of an unsharded checkpoint.
const HFWeightsFile = "model.safetensors"

// flagged are the settings that have a spill train flag (--layers ...);
// the others are TOML keys only.
var flagged = map[string]bool{"layers": true, "heads": true, "embd": true, "vocab": true, "max_seq": true, "model": true}

// settingName is how an error names a setting: its TOML key and flag.
func settingName(key string) string {
	if flagged[key] {
		return fmt.Sprintf("%s (--%s)", key, strings.ReplaceAll(key, "_", "-"))
	}
	return key + " (config file)"
}

// ResolveInitFrom fills c's model and shape from the config.json of the
// directory c.InitFrom names (nothing for a file or a directory without
// one: the settings then give the shape). Call it before EnsureDefaults:
// it sets the settings c leaves unset (zero) and reports, naming the
// config.json field and spill's setting, every one c sets to another
// value. The family comes from config.json's architectures: a model of
// another family is an error, except the default ("tiny"), which yields
// to the family's first preset (its shape wholly replaced by config.json;
// the preset only lends its training defaults). It is idempotent.
func ResolveInitFrom(c *Config) error {
	if c.InitFrom == "" {
		return nil
	}
	st, err := os.Stat(c.InitFrom)
	if err != nil {
		return fmt.Errorf("init_from: %w", err)
	}
	if !st.IsDir() {
		return nil
	}
	path := hfConfigPath(c.InitFrom)
	if path == "" {
		return nil
	}
	j, err := readHFConfig(path)
	if err != nil {
		return fmt.Errorf("init_from: %w", err)
	}
	fam, err := hfFamily(j)
	if err != nil {
		return fmt.Errorf("init_from: %w", err)
	}
	settings := fam.hfSettings(j)
	if err := j.err(); err != nil {
		return fmt.Errorf("init_from: %w", err)
	}
	if c.Model == "" || FamilyOf(c.Model).Name() != fam.Name() {
		if c.Model != "" && CanonicalModel(c.Model) != DefaultConfig().Model {
			arch, _ := fam.hfArchitecture()
			return fmt.Errorf("init_from: %s is a %s (the %s family), but %s is %q, a %s model: drop --model or name a %s preset",
				path, arch, fam.Name(), settingName("model"), c.Model, FamilyOf(c.Model).Name(), fam.Name())
		}
		c.Model = matchingPreset(fam, settings)
	}
	var errs []error
	for _, s := range settings {
		if err := applySetting(c, s); err != nil {
			errs = append(errs, fmt.Errorf("init_from: %s has %s = %s, but %s is %s: drop the setting or make them agree",
				path, s.field, showSetting(s.value), settingName(s.key), err))
		}
	}
	return errors.Join(errs...)
}

// matchingPreset is the family's preset whose shape config.json describes
// (llama3.2-1b for Llama-3.2-1B's), so that logs and plans name the model;
// the family's first preset (its training defaults only: the shape comes
// from config.json) when none does.
func matchingPreset(fam Family, settings []hfSetting) string {
	want := map[string]int{}
	for _, s := range settings {
		if v, ok := s.value.(int); ok {
			want[s.key] = v
		}
	}
	for _, p := range fam.Presets() {
		have := map[string]int{"layers": p.Layers, "heads": p.Heads, "embd": p.Embd, "vocab": p.Vocab, "kv_heads": p.KVHeads, "ffn": p.FFN}
		match := len(want) > 0
		for k, v := range have {
			if w, ok := want[k]; ok && v != 0 && w != v {
				match = false
			}
		}
		if match && want["layers"] == p.Layers && want["embd"] == p.Embd {
			return p.Name
		}
	}
	return fam.Presets()[0].Name
}

func showSetting(v any) string {
	if r, ok := v.(RoPEScalingConfig); ok {
		b, _ := json.Marshal(r)
		return string(b)
	}
	return fmt.Sprint(v)
}

// hfFields are the fields of c that config.json can set, by their
// setting's key: pointers to an int, a float64, a *bool or a
// *RoPEScalingConfig.
func hfFields(c *Config) map[string]any {
	return map[string]any{
		"layers": &c.Layers, "heads": &c.Heads, "embd": &c.Embd, "vocab": &c.Vocab,
		"max_seq": &c.MaxSeq, "kv_heads": &c.KVHeads, "ffn": &c.FFN,
		"rope_theta": &c.RoPETheta, "norm_eps": &c.NormEps,
		"tie_embeddings": &c.TieEmbeddings, "rope_scaling": &c.RoPEScaling,
	}
}

// applySetting sets s in c when c leaves it unset; a different value
// already there is returned as the error's text.
func applySetting(c *Config, s hfSetting) error {
	p, ok := hfFields(c)[s.key]
	if !ok {
		panic("engine: unknown setting " + s.key)
	}
	switch p := p.(type) {
	case *int:
		return fillSetting(p, s.value.(int))
	case *float64:
		return fillSetting(p, s.value.(float64))
	case **bool:
		return fillSettingPtr(p, s.value.(bool), func(v bool) string { return fmt.Sprint(v) })
	case **RoPEScalingConfig:
		return fillSettingPtr(p, s.value.(RoPEScalingConfig), func(v RoPEScalingConfig) string { return showSetting(v) })
	}
	return nil
}

// fillSetting sets *p to v when it is unset (zero); a different value
// already there is returned as the error's text.
func fillSetting[T comparable](p *T, v T) error {
	var zero T
	switch {
	case *p == zero:
		*p = v
	case *p != v:
		return fmt.Errorf("%v", *p)
	}
	return nil
}

// fillSettingPtr is fillSetting for a setting whose unset value is nil.
func fillSettingPtr[T comparable](p **T, v T, show func(T) string) error {
	switch {
	case *p == nil:
		*p = &v
	case **p != v:
		return errors.New(show(**p))
	}
	return nil
}

// stFile is one mapped safetensors file.
type stFile struct {
	path  string
	m     mmap.MMap
	data  []byte // the byte buffer after the header
	spans map[string]tensorSpan
}

// stRef is where a tensor of the checkpoint lives.
type stRef struct {
	file *stFile
	span tensorSpan
}

// bytes is the tensor's raw data (valid until Close).
func (r stRef) bytes() []byte { return r.file.data[r.span.begin:r.span.end:r.span.end] }

// Pretrained is an opened checkpoint of pretrained weights: the mapped
// safetensors files of an --init-from path. Its methods are not safe for
// concurrent use, except the reads of LoadPretrained. Close unmaps the
// files.
type Pretrained struct {
	// Path is what was opened; Where names the file that lists the
	// tensors (the index of a sharded checkpoint, else the one file).
	Path, Where string
	// HasConfig reports a config.json beside the weights (the layout is
	// then Hugging Face's).
	HasConfig bool

	files   []*stFile
	tensors map[string]stRef

	// Set by Bind.
	model  *Model
	layout string
	layers [][]boundTensor // per model layer
}

// boundTensor is a checkpoint tensor bound to a model parameter.
type boundTensor struct {
	ext extTensor
	ref stRef
}

// OpenPretrained opens path (see Config.InitFrom): it maps the
// safetensors file or the directory's model.safetensors, or the shards
// its model.safetensors.index.json lists, and validates their headers
// (a truncated file, overlapping or out-of-range tensors, a tensor the
// index maps to a shard that does not hold it are errors naming the file
// and tensor). No tensor data is read.
func OpenPretrained(path string) (_ *Pretrained, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("init_from: %w", err)
	}
	p := &Pretrained{Path: path, tensors: map[string]stRef{}}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if !st.IsDir() {
		f, err := mapSafetensors(path)
		if err != nil {
			return nil, err
		}
		p.files, p.Where = []*stFile{f}, path
		for name, s := range f.spans {
			p.tensors[name] = stRef{f, s}
		}
		return p, nil
	}
	p.HasConfig = hfConfigPath(path) != ""
	index := filepath.Join(path, HFIndexFile)
	single := filepath.Join(path, HFWeightsFile)
	switch {
	case fileExists(index):
		p.Where = index
		return p, p.openIndex(path, index)
	case fileExists(single):
		f, err := mapSafetensors(single)
		if err != nil {
			return nil, err
		}
		p.files, p.Where = []*stFile{f}, single
		for name, s := range f.spans {
			p.tensors[name] = stRef{f, s}
		}
		return p, nil
	}
	hint := ""
	if fileExists(filepath.Join(path, "pytorch_model.bin")) {
		hint = " (pytorch_model.bin is a pickle, which spill does not read: save the model with safetensors)"
	}
	return nil, fmt.Errorf("init_from: %s has neither %s nor %s%s", path, HFWeightsFile, HFIndexFile, hint)
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// openIndex maps the shards of a sharded checkpoint.
func (p *Pretrained) openIndex(dir, index string) error {
	data, err := os.ReadFile(index)
	if err != nil {
		return fmt.Errorf("init_from: %w", err)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return fmt.Errorf("init_from: index %s: %w", index, err)
	}
	if len(idx.WeightMap) == 0 {
		return fmt.Errorf("init_from: index %s: no weight_map (or an empty one)", index)
	}
	byFile := map[string][]string{}
	for name, file := range idx.WeightMap {
		if file == "" || filepath.Base(file) != file || file == "." || file == ".." {
			return fmt.Errorf("init_from: index %s: tensor %q maps to %q, which is not a file name in %s", index, name, file, dir)
		}
		byFile[file] = append(byFile[file], name)
	}
	files := make([]string, 0, len(byFile))
	for f := range byFile {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, name := range files {
		sp := filepath.Join(dir, name)
		f, err := mapSafetensors(sp)
		if err != nil {
			return fmt.Errorf("%w (a shard listed in %s)", err, index)
		}
		p.files = append(p.files, f)
		names := byFile[name]
		sort.Strings(names)
		for _, t := range names {
			s, ok := f.spans[t]
			if !ok {
				return fmt.Errorf("init_from: index %s maps tensor %q to %s, which does not hold it", index, t, sp)
			}
			p.tensors[t] = stRef{f, s}
		}
	}
	return nil
}

// mapSafetensors maps path read-only and validates its header against its
// size.
func mapSafetensors(path string) (_ *stFile, err error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("init_from: safetensors file %s: %s", path, fmt.Sprintf(format, args...))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("init_from: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("init_from: %w", err)
	}
	if st.Size() < 8 {
		return nil, fail("%d bytes, too short for the 8-byte header length (truncated?)", st.Size())
	}
	m, err := mmap.Map(f, mmap.RDONLY, 0)
	if err != nil {
		return nil, fail("mmap: %v", err)
	}
	sf := &stFile{path: path, m: m}
	defer func() {
		if err != nil {
			sf.unmap()
		}
	}()
	n := binary.LittleEndian.Uint64(m[:8])
	if n > maxSafetensorsHeader {
		return nil, fail("header length %d exceeds the %d-byte limit (not a safetensors file?)", n, maxSafetensorsHeader)
	}
	if int64(n) > int64(len(m))-8 {
		return nil, fail("header length %d exceeds the %d bytes after the length field (truncated?)", n, len(m)-8)
	}
	sf.data = m[8+n:]
	spans, _, err := parseSafetensorsHeader(m[8:8+n], int64(len(sf.data)))
	if err != nil {
		return nil, fail("%v", err)
	}
	sf.spans = make(map[string]tensorSpan, len(spans))
	for _, s := range spans {
		sf.spans[s.name] = s
	}
	return sf, nil
}

func (f *stFile) unmap() error {
	if f.m == nil {
		return nil
	}
	err := f.m.Unmap()
	f.m, f.data = nil, nil
	return err
}

// Close unmaps the files.
func (p *Pretrained) Close() error {
	var errs []error
	for _, f := range p.files {
		if err := f.unmap(); err != nil {
			errs = append(errs, fmt.Errorf("init_from: unmap %s: %w", f.path, err))
		}
	}
	p.files, p.tensors = nil, nil
	return errors.Join(errs...)
}

// Layout is the checkpoint layout Bind chose (FormatHF or FormatNanoGPT).
func (p *Pretrained) Layout() string { return p.layout }

// loadableDType reports the dtypes the loader converts to fp32.
func loadableDType(dt string) bool { return dt == "F32" || dt == "BF16" || dt == "F16" }

// Bind checks the checkpoint against m and remembers, for each of m's
// parameters, the tensor that holds it. The layout is Hugging Face's when
// the directory has a config.json, else the family's layout whose shapes
// the most tensors match (see gpt_hf.go). Every problem is reported at
// once (errors.Join), each naming the tensor and its file: a missing
// tensor, a dtype other than F32, BF16 or F16, a wrong shape, a tensor
// that is no parameter of m, a tied copy (lm_head.weight of a tied head)
// that differs from what it copies.
func (p *Pretrained) Bind(m *Model) error {
	layouts := m.Family.layouts(m)
	best := 0
	if !p.HasConfig && len(layouts) > 1 {
		score := func(l extLayout) int {
			n := 0
			for _, t := range l.Tensors {
				if r, ok := p.lookup(t); ok && sameShape(r.span.shape, t.Shape) {
					n++
				}
			}
			return n
		}
		for i := 1; i < len(layouts); i++ {
			if score(layouts[i]) > score(layouts[best]) {
				best = i
			}
		}
	}
	l := layouts[best]
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("init_from: "+format, args...))
	}
	used := map[string]bool{}
	layers := make([][]boundTensor, len(m.Layers))
	for _, t := range l.Tensors {
		r, ok := p.lookup(t)
		if !ok {
			bad("tensor %q is missing from %s (%s layout of the %s model)", t.Name, p.Where, l.Format, m.Family.Name())
			continue
		}
		used[r.span.name] = true
		if !loadableDType(r.span.dtype) {
			bad("tensor %q in %s: dtype %s, want F32, BF16 or F16", r.span.name, r.file.path, r.span.dtype)
			continue
		}
		if !sameShape(r.span.shape, t.Shape) {
			hint := ""
			if len(t.Shape) == 2 && sameShape(r.span.shape, []int{t.Shape[1], t.Shape[0]}) {
				hint = " (its transpose: a checkpoint in another layout?)"
			}
			bad("tensor %q in %s: shape %v, the model needs %v%s", r.span.name, r.file.path, r.span.shape, t.Shape, hint)
			continue
		}
		layers[t.Layer] = append(layers[t.Layer], boundTensor{ext: t, ref: r})
	}
	byName := map[string]extTensor{}
	for _, t := range l.Tensors {
		byName[t.Name] = t
	}
	names := make([]string, 0, len(p.tensors))
	for n := range p.tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if used[n] || l.Buffer(n) {
			continue
		}
		r := p.tensors[n]
		if src, ok := l.Tied[n]; ok {
			if err := p.checkTiedCopy(r, src, byName[src]); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		bad("tensor %q in %s is not a parameter of the %s model (%s layout)", n, r.file.path, m.Family.Name(), l.Format)
	}
	if len(errs) > 0 {
		const show = 12
		if len(errs) > show {
			errs = append(errs[:show], fmt.Errorf("init_from: ... and %d more problems", len(errs)-show))
		}
		return errors.Join(errs...)
	}
	p.model, p.layout, p.layers = m, l.Format, layers
	return nil
}

// lookup finds t's tensor under its name or an alias.
func (p *Pretrained) lookup(t extTensor) (stRef, bool) {
	if r, ok := p.tensors[t.Name]; ok {
		return r, true
	}
	for _, a := range t.Aliases {
		if r, ok := p.tensors[a]; ok {
			return r, true
		}
	}
	return stRef{}, false
}

// checkTiedCopy checks that the tied copy r holds what the tensor named
// src (t) holds.
func (p *Pretrained) checkTiedCopy(r stRef, src string, t extTensor) error {
	s, ok := p.lookup(t)
	if !ok {
		return nil // reported as missing
	}
	if !loadableDType(r.span.dtype) || !sameShape(r.span.shape, s.span.shape) {
		return fmt.Errorf("init_from: tensor %q in %s (%s %v) is tied to %q (%s %v) but does not match it",
			r.span.name, r.file.path, r.span.dtype, r.span.shape, s.span.name, s.span.dtype, s.span.shape)
	}
	if !loadableDType(s.span.dtype) {
		return nil // reported
	}
	n := t.Param.Elems()
	a, b := make([]float32, n), make([]float32, n)
	decodeF32(a, r.bytes(), r.span.dtype)
	decodeF32(b, s.bytes(), s.span.dtype)
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return fmt.Errorf("init_from: tensor %q in %s differs from %q (element %d: %v vs %v), but the model ties them (one LM head and embedding: tie_word_embeddings)",
				r.span.name, r.file.path, s.span.name, i, a[i], b[i])
		}
	}
	return nil
}

// decodeF32 converts a tensor's little-endian elements of dtype dt (F32,
// BF16 or F16) to float32: exactly, each being a float32 value.
func decodeF32(dst []float32, src []byte, dt string) {
	switch dt {
	case "F32":
		if littleEndian {
			copy(f32Bytes(dst), src)
			return
		}
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case "BF16":
		for i := range dst {
			dst[i] = kernels.F32FromBF16(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case "F16":
		for i := range dst {
			dst[i] = kernels.F32FromF16(binary.LittleEndian.Uint16(src[2*i:]))
		}
	default:
		panic("engine: decodeF32: dtype " + dt)
	}
}

// fillLayer writes layer i's parameters, converted to fp32 (and
// transposed where the layout says so), into master (the layer's
// NumParams-element block), and drops the source pages from the mapping.
func (p *Pretrained) fillLayer(i int, master []float32) {
	for _, b := range p.layers[i] {
		ps := b.ext.Param
		dst := master[ps.Offset : ps.Offset+ps.Elems()]
		src := b.ref.bytes()
		if b.ext.Transpose {
			// The checkpoint's (in, out) rows, column by column into
			// spill's (out, in).
			in, out := b.ext.Shape[0], b.ext.Shape[1]
			row := make([]float32, out)
			size := len(src) / (in * out)
			for r := 0; r < in; r++ {
				decodeF32(row, src[r*out*size:(r+1)*out*size], b.ref.span.dtype)
				for c, v := range row {
					dst[c*in+r] = v
				}
			}
		} else {
			decodeF32(dst, src, b.ref.span.dtype)
		}
		dontNeed(src)
	}
}

// boundTo reports whether Bind bound p to a model with m's parameters.
func (p *Pretrained) boundTo(m *Model) bool {
	if p.model == nil || len(p.model.Layers) != len(m.Layers) {
		return false
	}
	for i, l := range m.Layers {
		a, b := l.Params(), p.model.Layers[i].Params()
		if len(a) != len(b) {
			return false
		}
		for k := range a {
			if a[k].Name != b[k].Name || a[k].Offset != b[k].Offset || !sameShape(a[k].Shape, b[k].Shape) {
				return false
			}
		}
	}
	return true
}

// LoadPretrained sets every layer's fp32 master weights (and compute
// copy) from p, which Bind must have bound to the trainer's model, the
// layers spread over the cores.
func (t *Trainer) LoadPretrained(ctx context.Context, p *Pretrained) error {
	if !p.boundTo(t.model) {
		return errors.New("engine: LoadPretrained: the checkpoint is not bound to a model of this one's parameters (Pretrained.Bind)")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Under data parallelism rank 0 reads and broadcasts (engine/ddp_sync.go).
	return t.setMasters(ctx, func(i int, master []float32) { p.fillLayer(i, master) })
}
