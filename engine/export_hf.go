package engine

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
)

// DefaultShardSize is the largest safetensors file ExportHF writes by
// default before it shards (5 GB, as transformers' save_pretrained).
const DefaultShardSize = 5_000_000_000

// HFExportOptions are ExportHF's options.
type HFExportOptions struct {
	// ShardSize is the most tensor bytes per safetensors file; a model
	// larger is written as model-0000N-of-0000M.safetensors with
	// model.safetensors.index.json (a tensor larger than ShardSize gets a
	// file of its own). 0 = DefaultShardSize.
	ShardSize int64
}

// hfOut is one tensor of an export: its header entry and how to produce
// its bytes.
type hfOut struct {
	name  string
	shape []int
	size  int64
	// fill: write reads the tensor (NamedTensor.Fill) into the shared
	// buffer bufs.tensor, grown to size.
	fill  bool
	write func(w io.Writer, bufs *exportBufs) error
}

// exportBufs are the buffers an export reuses from tensor to tensor.
type exportBufs struct {
	tensor    []byte // the tensor filled on demand being written
	transpose []byte // writeTransposedF32's
	w         *bufio.Writer
}

// ExportHF writes fp32 master weights (spill's names, as a checkpoint
// holds them) as a Hugging Face model directory dir that
// transformers.AutoModelForCausalLM.from_pretrained loads:
//
//	config.json                   the family's (GPT2LMHeadModel, LlamaForCausalLM)
//	model.safetensors             F32 tensors in the family's HF layout, or
//	model-0000N-of-0000M.safetensors and model.safetensors.index.json
//	                              above o.ShardSize
//
// A tied LM head is not written (save_pretrained leaves it out too:
// from_pretrained ties it). cfg describes the model (a checkpoint's
// config, dataset-derived fields filled). The directory is written whole
// under a temporary name beside dir, every file fsynced, and renamed to
// dir, which must not exist or be empty; nothing is left at dir on error.
func ExportHF(weights []NamedTensor, cfg Config, dir string, o HFExportOptions) (err error) {
	if o.ShardSize <= 0 {
		o.ShardSize = DefaultShardSize
	}
	fam := cfg.Family()
	if arch, _ := fam.hfArchitecture(); arch == "" {
		return fmt.Errorf("export: model %s (the %s family) has no Hugging Face architecture; export it with --format %s", cfg.Model, fam.Name(), FormatNanoGPT)
	}
	m, err := fam.build(&cfg, dataset.Schema{}, kernels.F32)
	if err != nil {
		return fmt.Errorf("export: model %s: %w", cfg.Model, err)
	}
	outs, err := hfTensors(weights, m)
	if err != nil {
		return err
	}
	// The tensors filled on demand are read one at a time into scratch,
	// the size of the largest of them: the only tensor-sized buffer.
	var largest int64
	for _, t := range outs {
		if t.fill {
			largest = max(largest, t.size)
		}
	}
	bufs := &exportBufs{tensor: make([]byte, 0, largest)}

	// Shards: tensors in model order, a new file when the next tensor
	// would take this one past the size.
	var shards [][]hfOut
	var cur int64
	for _, t := range outs {
		if len(shards) == 0 || (cur > 0 && cur+t.size > o.ShardSize) {
			shards = append(shards, nil)
			cur = 0
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], t)
		cur += t.size
	}

	if st, err := os.Stat(dir); err == nil {
		ents, _ := os.ReadDir(dir)
		if !st.IsDir() || len(ents) > 0 {
			return fmt.Errorf("export: %s exists: remove it or choose another --out", dir)
		}
	}
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(filepath.Clean(dir))+".tmp-*")
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	weightMap := map[string]string{}
	var total int64
	for k, sh := range shards {
		name := HFWeightsFile
		if len(shards) > 1 {
			name = fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, len(shards))
		}
		if _, err := writeSyncedFile(filepath.Join(tmp, name), func(w io.Writer) error { return encodeShard(w, sh, bufs) }); err != nil {
			return fmt.Errorf("export: write %s: %w", filepath.Join(dir, name), err)
		}
		for _, t := range sh {
			weightMap[t.name] = name
			total += t.size
		}
	}
	files := []struct {
		name string
		v    any
	}{{HFConfigFile, fam.hfConfig(m)}}
	if len(shards) > 1 {
		files = append(files, struct {
			name string
			v    any
		}{HFIndexFile, map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}})
	}
	for _, f := range files {
		js, err := json.MarshalIndent(f.v, "", "  ")
		if err != nil {
			return fmt.Errorf("export: %s: %w", f.name, err)
		}
		if _, err := writeSyncedFile(filepath.Join(tmp, f.name), func(w io.Writer) error {
			_, err := w.Write(append(js, '\n'))
			return err
		}); err != nil {
			return fmt.Errorf("export: write %s: %w", filepath.Join(dir, f.name), err)
		}
	}
	if err := syncDir(tmp); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("export: %w", err) // an empty directory in the way
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := syncDir(parent); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

// hfTensors maps the checkpoint's weights to m's Hugging Face layout (the
// family's first), checking that every parameter is there with its shape
// and that nothing else is.
func hfTensors(weights []NamedTensor, m *Model) ([]hfOut, error) {
	byName := make(map[string]NamedTensor, len(weights))
	for _, w := range weights {
		byName[w.Name] = w
	}
	l := m.Family.layouts(m)[0]
	used := map[string]bool{}
	var outs []hfOut
	var errs []error
	for _, t := range l.Tensors {
		w, ok := byName[t.Param.Name]
		if !ok {
			errs = append(errs, fmt.Errorf("export: missing tensor %q (the %s model has it)", t.Param.Name, m.Family.Name()))
			continue
		}
		used[w.Name] = true
		size := tensorBytes(w)
		if w.DType != "F32" || !sameShape(w.Shape, t.Param.Shape) || size != 4*int64(t.Param.Elems()) {
			errs = append(errs, fmt.Errorf("export: tensor %q is %s %v, the model needs F32 %v (is the config the checkpoint's?)", w.Name, w.DType, w.Shape, t.Param.Shape))
			continue
		}
		src, t := w, t
		o := hfOut{name: t.Name, shape: t.Shape, size: size, fill: w.Data == nil && w.Fill != nil}
		o.write = func(w io.Writer, bufs *exportBufs) error {
			data := src.Data
			if data == nil && src.Fill != nil {
				if int64(cap(bufs.tensor)) < size {
					bufs.tensor = make([]byte, size)
				}
				data = bufs.tensor[:size]
				if err := src.Fill(data); err != nil {
					return fmt.Errorf("tensor %q: %w", src.Name, err)
				}
			}
			if t.Transpose {
				return writeTransposedF32(w, data, t.Param.Shape[0], t.Param.Shape[1], &bufs.transpose)
			}
			_, err := w.Write(data)
			return err
		}
		outs = append(outs, o)
	}
	for _, w := range weights {
		if !used[w.Name] {
			errs = append(errs, fmt.Errorf("export: tensor %q is not a parameter of the %s model (is the config the checkpoint's?)", w.Name, m.Family.Name()))
		}
	}
	return outs, errors.Join(errs...)
}

// encodeShard writes one safetensors file of the tensors ts (F32), laid
// out in name order, with the metadata {"format": "pt"} that
// transformers requires. The tensors filled on demand go through
// bufs (the shards of one export share them).
func encodeShard(w io.Writer, ts []hfOut, bufs *exportBufs) error {
	ts = append([]hfOut(nil), ts...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].name < ts[j].name })
	hdr := map[string]any{safetensorsMetadataKey: map[string]string{"format": "pt"}}
	var off int64
	for _, t := range ts {
		hdr[t.name] = safetensorsEntry{DType: "F32", Shape: t.shape, DataOffsets: [2]int64{off, off + t.size}}
		off += t.size
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	if bufs.w == nil {
		bufs.w = bufio.NewWriterSize(w, 1<<20)
	}
	bw := bufs.w
	bw.Reset(w)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	bw.Write(n[:])
	bw.Write(js)
	for _, t := range ts {
		if err := t.write(bw, bufs); err != nil {
			return err
		}
	}
	return bw.Flush() // bufio keeps the first error
}
