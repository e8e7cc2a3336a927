package engine

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"sort"
)

// The safetensors format (https://github.com/huggingface/safetensors):
//
//	[8 bytes] N, little-endian uint64: the header's length
//	[N bytes] JSON object, UTF-8, starting with '{' and possibly padded with
//	          trailing spaces; each key is a tensor name mapped to
//	          {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//	          plus an optional "__metadata__" object of string -> string
//	[rest]    the byte buffer; data_offsets are relative to its start
//
// Tensors are stored row-major, little-endian, without holes: the offsets
// of all tensors, sorted, tile the byte buffer exactly. WriteSafetensors
// sorts tensors by name, lays them out in that order and pads the header
// with spaces so that the byte buffer starts at a multiple of 8.

// NamedTensor is one tensor of a safetensors file. Data holds the raw
// little-endian elements, row-major; len(Data) must equal the product of
// Shape times the dtype's size (an empty Shape is a scalar).
type NamedTensor struct {
	Name  string
	DType string // "F32", "BF16", "F16", "I32", ... (safetensors spelling)
	Shape []int
	Data  []byte
	// Fill, if set and Data is nil, writes the tensor's bytes into dst
	// (exactly its size) when EncodeSafetensors reaches it: a tensor read
	// from where it lives (device, disk) only when it is written, into a
	// buffer the encoder reuses for every such tensor.
	Fill func(dst []byte) error
}

// Elements is the number of elements Shape describes.
func (t *NamedTensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// Float32s decodes an F32 tensor's data.
func (t *NamedTensor) Float32s() ([]float32, error) {
	if t.DType != "F32" {
		return nil, fmt.Errorf("tensor %q: dtype %s, want F32", t.Name, t.DType)
	}
	if len(t.Data)%4 != 0 {
		return nil, fmt.Errorf("tensor %q: %d bytes is not a whole number of F32 elements", t.Name, len(t.Data))
	}
	out := make([]float32, len(t.Data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return out, nil
}

// F32Tensor builds an F32 NamedTensor from values.
func F32Tensor(name string, shape []int, values []float32) NamedTensor {
	data := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return NamedTensor{Name: name, DType: "F32", Shape: append([]int(nil), shape...), Data: data}
}

// safetensorsDTypeSize maps the safetensors dtype names to element sizes.
var safetensorsDTypeSize = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// maxSafetensorsHeader bounds the JSON header (the reference
// implementation's limit is 100 MB).
const maxSafetensorsHeader = 100 << 20

const safetensorsMetadataKey = "__metadata__"

type safetensorsEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// tensorSpan is a parsed header entry.
type tensorSpan struct {
	name       string
	dtype      string
	shape      []int
	begin, end int64
}

// buildSafetensorsHeader validates ts and returns the padded header and the
// tensors in file order.
func buildSafetensorsHeader(ts []NamedTensor, meta map[string]string) ([]byte, []*NamedTensor, error) {
	order := make([]*NamedTensor, len(ts))
	for i := range ts {
		order[i] = &ts[i]
	}
	sort.Slice(order, func(i, j int) bool { return order[i].Name < order[j].Name })
	hdr := make(map[string]any, len(ts)+1)
	if len(meta) > 0 {
		hdr[safetensorsMetadataKey] = meta
	}
	var off int64
	for i, t := range order {
		if t.Name == "" || t.Name == safetensorsMetadataKey {
			return nil, nil, fmt.Errorf("invalid tensor name %q", t.Name)
		}
		if i > 0 && order[i-1].Name == t.Name {
			return nil, nil, fmt.Errorf("duplicate tensor name %q", t.Name)
		}
		size, ok := safetensorsDTypeSize[t.DType]
		if !ok {
			return nil, nil, fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		n, err := shapeBytes(t.Shape, size)
		if err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		if (t.Data != nil || t.Fill == nil) && n != int64(len(t.Data)) {
			return nil, nil, fmt.Errorf("tensor %q: shape %v of %s needs %d bytes, data has %d", t.Name, t.Shape, t.DType, n, len(t.Data))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		hdr[t.Name] = safetensorsEntry{DType: t.DType, Shape: shape, DataOffsets: [2]int64{off, off + n}}
		off += n
	}
	js, err := json.Marshal(hdr) // map keys are sorted
	if err != nil {
		return nil, nil, err
	}
	if pad := (8 - len(js)%8) % 8; pad > 0 {
		js = append(js, bytes.Repeat([]byte{' '}, pad)...)
	}
	return js, order, nil
}

// shapeBytes is the byte size of shape with elements of size bytes, or an
// error for negative dimensions or overflow.
func shapeBytes(shape []int, size int) (int64, error) {
	n := uint64(size)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("shape %v overflows", shape)
		}
		n = lo
	}
	return int64(n), nil
}

// safetensorsIOBuf is the size of the buffers that safetensors files are
// written and streamed through.
const safetensorsIOBuf = 256 << 10

// EncodeSafetensors writes ts and meta in safetensors format to w. The
// tensors with Fill are filled one after the other into one buffer of the
// largest one's size: that buffer (and a write buffer of
// safetensorsIOBuf) is all the memory it takes besides the header.
func EncodeSafetensors(w io.Writer, ts []NamedTensor, meta map[string]string) error {
	return encodeSafetensors(w, ts, meta, new([]byte))
}

// encodeSafetensors is EncodeSafetensors filling the tensors with Fill
// into *scratch, grown as needed (several files share one buffer).
func encodeSafetensors(w io.Writer, ts []NamedTensor, meta map[string]string, scratch *[]byte) error {
	hdr, order, err := buildSafetensorsHeader(ts, meta)
	if err != nil {
		return err
	}
	var fill int64
	for _, t := range order {
		if t.Data == nil && t.Fill != nil {
			n, _ := shapeBytes(t.Shape, safetensorsDTypeSize[t.DType]) // checked by the header
			fill = max(fill, n)
		}
	}
	if int64(cap(*scratch)) < fill {
		*scratch = make([]byte, fill)
	}
	buf := (*scratch)[:cap(*scratch)]
	bw := bufio.NewWriterSize(w, safetensorsIOBuf)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
	bw.Write(n[:])
	bw.Write(hdr)
	for _, t := range order {
		data := t.Data
		if data == nil && t.Fill != nil {
			nb, _ := shapeBytes(t.Shape, safetensorsDTypeSize[t.DType])
			data = buf[:nb]
			if err := t.Fill(data); err != nil {
				return fmt.Errorf("tensor %q: %w", t.Name, err)
			}
		}
		if _, err := bw.Write(data); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// WriteSafetensors writes ts (in any order; the file lists them sorted by
// name) and meta to path atomically: a temporary file in the same
// directory is written, fsynced and renamed over path, and the directory is
// fsynced. Names must be unique and non-empty and each Data must match its
// Shape and DType.
func WriteSafetensors(path string, ts []NamedTensor, meta map[string]string) error {
	if err := WriteFileAtomic(path, func(w io.Writer) error { return EncodeSafetensors(w, ts, meta) }); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// WriteFileAtomic writes path through a temporary file in the same
// directory: write, fsync, close, rename, fsync the directory. Nothing is
// left at path unless every step succeeded.
func WriteFileAtomic(path string, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = write(f); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir fsyncs a directory so that a rename into it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReadSafetensors reads a whole safetensors file. It validates the header
// (length, JSON, dtypes, shapes, that every tensor's size matches its
// shape and that the data offsets tile the byte buffer exactly) and returns
// the tensors in file order with Data aliasing one buffer. Errors name the
// file and, where one is at fault, the tensor.
func ReadSafetensors(path string) ([]NamedTensor, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	ts, meta, err := DecodeSafetensors(f, st.Size())
	if err != nil {
		return nil, nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	return ts, meta, nil
}

// DecodeSafetensors reads safetensors data of the given total size from r.
func DecodeSafetensors(r io.Reader, size int64) ([]NamedTensor, map[string]string, error) {
	if size < 8 {
		return nil, nil, fmt.Errorf("file is %d bytes, too short for the 8-byte header length (truncated?)", size)
	}
	var nb [8]byte
	if _, err := io.ReadFull(r, nb[:]); err != nil {
		return nil, nil, fmt.Errorf("reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(nb[:])
	if n > maxSafetensorsHeader {
		return nil, nil, fmt.Errorf("header length %d exceeds the %d-byte limit (not a safetensors file?)", n, maxSafetensorsHeader)
	}
	if int64(n) > size-8 {
		return nil, nil, fmt.Errorf("header length %d exceeds the %d bytes after the length field (truncated?)", n, size-8)
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, nil, fmt.Errorf("reading header: %w", err)
	}
	dataLen := size - 8 - int64(n)
	spans, meta, err := parseSafetensorsHeader(hdr, dataLen)
	if err != nil {
		return nil, nil, err
	}
	buf := make([]byte, dataLen)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, nil, fmt.Errorf("reading %d data bytes: %w", dataLen, err)
	}
	ts := make([]NamedTensor, len(spans))
	for i, s := range spans {
		ts[i] = NamedTensor{Name: s.name, DType: s.dtype, Shape: s.shape, Data: buf[s.begin:s.end:s.end]}
	}
	return ts, meta, nil
}

// decodeSafetensorsBytes decodes a whole file held in data; the tensors'
// Data alias it.
func decodeSafetensorsBytes(data []byte) ([]NamedTensor, map[string]string, error) {
	size := int64(len(data))
	if size < 8 {
		return nil, nil, fmt.Errorf("file is %d bytes, too short for the 8-byte header length (truncated?)", size)
	}
	n := binary.LittleEndian.Uint64(data)
	if n > maxSafetensorsHeader {
		return nil, nil, fmt.Errorf("header length %d exceeds the %d-byte limit (not a safetensors file?)", n, maxSafetensorsHeader)
	}
	if int64(n) > size-8 {
		return nil, nil, fmt.Errorf("header length %d exceeds the %d bytes after the length field (truncated?)", n, size-8)
	}
	buf := data[8+n:]
	spans, meta, err := parseSafetensorsHeader(data[8:8+n], int64(len(buf)))
	if err != nil {
		return nil, nil, err
	}
	ts := make([]NamedTensor, len(spans))
	for i, s := range spans {
		ts[i] = NamedTensor{Name: s.name, DType: s.dtype, Shape: s.shape, Data: buf[s.begin:s.end:s.end]}
	}
	return ts, meta, nil
}

// parseSafetensorsHeader parses and validates a header for a byte buffer
// of dataLen bytes. It returns the tensors sorted by data offset.
func parseSafetensorsHeader(hdr []byte, dataLen int64) ([]tensorSpan, map[string]string, error) {
	trimmed := bytes.TrimRight(hdr, " ")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, nil, errors.New("header is not a JSON object (must start with '{')")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, fmt.Errorf("header is not a JSON object: %v", err)
	}
	var (
		spans []tensorSpan
		meta  map[string]string
		seen  = map[string]bool{}
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("header JSON: %w", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, nil, fmt.Errorf("header JSON: unexpected %v", tok)
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("tensor %q: listed twice in the header", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, fmt.Errorf("header JSON at key %q: %w", name, err)
		}
		if name == safetensorsMetadataKey {
			if err := json.Unmarshal(raw, &meta); err != nil {
				return nil, nil, fmt.Errorf("__metadata__ must map strings to strings: %w", err)
			}
			continue
		}
		if name == "" {
			return nil, nil, errors.New("empty tensor name in header")
		}
		var e safetensorsEntry
		ed := json.NewDecoder(bytes.NewReader(raw))
		ed.DisallowUnknownFields()
		if err := ed.Decode(&e); err != nil {
			return nil, nil, fmt.Errorf("tensor %q: bad header entry: %w", name, err)
		}
		size, ok := safetensorsDTypeSize[e.DType]
		if !ok {
			return nil, nil, fmt.Errorf("tensor %q: unknown dtype %q", name, e.DType)
		}
		if e.Shape == nil {
			return nil, nil, fmt.Errorf("tensor %q: missing shape", name)
		}
		nbytes, err := shapeBytes(e.Shape, size)
		if err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		b, en := e.DataOffsets[0], e.DataOffsets[1]
		if b < 0 || en < b || en > dataLen {
			return nil, nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] outside the %d-byte data buffer (truncated?)", name, b, en, dataLen)
		}
		if en-b != nbytes {
			return nil, nil, fmt.Errorf("tensor %q: shape %v of %s needs %d bytes, data_offsets [%d, %d] hold %d", name, e.Shape, e.DType, nbytes, b, en, en-b)
		}
		spans = append(spans, tensorSpan{name: name, dtype: e.DType, shape: e.Shape, begin: b, end: en})
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, fmt.Errorf("header JSON: %w", err)
	}
	if dec.More() {
		return nil, nil, errors.New("header JSON: trailing data after the object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, errors.New("header JSON: trailing data after the object")
	}
	sort.SliceStable(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].end < spans[j].end
	})
	var off int64
	for _, s := range spans {
		if s.begin != off {
			if s.begin < off {
				return nil, nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap the previous tensor (ending at %d)", s.name, s.begin, s.end, off)
			}
			return nil, nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] leave a hole after byte %d", s.name, s.begin, s.end, off)
		}
		off = s.end
	}
	if off != dataLen {
		return nil, nil, fmt.Errorf("tensors cover %d bytes but the data buffer has %d (trailing garbage or wrong header)", off, dataLen)
	}
	return spans, meta, nil
}
