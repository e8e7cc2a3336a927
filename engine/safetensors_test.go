package engine

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func sampleTensors() []NamedTensor {
	return []NamedTensor{
		F32Tensor("b.weight", []int{2, 3}, []float32{1, 2, 3, 4, 5, 6}),
		F32Tensor("a.bias", []int{3}, []float32{-1, 0.5, 7}),
		{Name: "c.scalar", DType: "I32", Shape: []int{}, Data: []byte{1, 0, 0, 0}},
		{Name: "d.empty", DType: "BF16", Shape: []int{0, 4}, Data: []byte{}},
		{Name: "e.half", DType: "F16", Shape: []int{1}, Data: []byte{0x00, 0x3c}},
	}
}

func TestSafetensorsRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	in := sampleTensors()
	meta := map[string]string{"format": "pt", "note": "hello"}
	if err := WriteSafetensors(path, in, meta); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	if (8+n)%8 != 0 {
		t.Errorf("data starts at %d, not 8-aligned", 8+n)
	}
	if raw[8] != '{' {
		t.Errorf("header starts with %q", raw[8])
	}
	out, gotMeta, err := ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotMeta, meta) {
		t.Errorf("meta = %v, want %v", gotMeta, meta)
	}
	byName := map[string]NamedTensor{}
	for _, o := range out {
		byName[o.Name] = o
	}
	if len(byName) != len(in) {
		t.Fatalf("read %d tensors, want %d", len(byName), len(in))
	}
	for _, want := range in {
		got := byName[want.Name]
		if got.DType != want.DType || !reflect.DeepEqual(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
			t.Errorf("%s: got %s %v %x, want %s %v %x", want.Name, got.DType, got.Shape, got.Data, want.DType, want.Shape, want.Data)
		}
	}
	w := byName["b.weight"]
	f, err := w.Float32s()
	if err != nil || !reflect.DeepEqual(f, []float32{1, 2, 3, 4, 5, 6}) {
		t.Errorf("Float32s = %v, %v", f, err)
	}
	// No temporary files are left behind.
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want 1", len(ents))
	}
}

func TestWriteSafetensorsRejects(t *testing.T) {
	dir := t.TempDir()
	cases := map[string][]NamedTensor{
		"needs":     {{Name: "x", DType: "F32", Shape: []int{2}, Data: make([]byte, 4)}},
		"duplicate": {F32Tensor("x", []int{1}, []float32{1}), F32Tensor("x", []int{1}, []float32{1})},
		"dtype":     {{Name: "x", DType: "F33", Shape: []int{1}, Data: make([]byte, 4)}},
		"negative":  {{Name: "x", DType: "F32", Shape: []int{-1}, Data: nil}},
		"name":      {F32Tensor("", []int{1}, []float32{1})},
	}
	for want, ts := range cases {
		path := filepath.Join(dir, want+".safetensors")
		err := WriteSafetensors(path, ts, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v", want, err)
		}
		if _, serr := os.Stat(path); serr == nil {
			t.Errorf("%s: file written despite error", want)
		}
	}
}

// rawFile assembles a safetensors file from a header string and data.
func rawFile(hdr string, data []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(hdr)))
	b.WriteString(hdr)
	b.Write(data)
	return b.Bytes()
}

func TestReadSafetensorsRejects(t *testing.T) {
	dir := t.TempDir()
	good := `{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"short", []byte{1, 2, 3}, "too short"},
		{"hdrlen", append(binary.LittleEndian.AppendUint64(nil, 1000), '{', '}'), "exceeds"},
		{"notobj", rawFile(`[1]`, nil), "JSON object"},
		{"truncated", rawFile(good, make([]byte, 4)), `tensor "w"`},
		{"trailing", rawFile(good, make([]byte, 12)), "data buffer has 12"},
		{"size", rawFile(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, make([]byte, 8)), `tensor "w": shape [3]`},
		{"dtype", rawFile(`{"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)), "unknown dtype"},
		{"hole", rawFile(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}`, make([]byte, 6)), `tensor "b"`},
		{"overlap", rawFile(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}`, make([]byte, 4)), "overlap"},
		{"dup", rawFile(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, make([]byte, 2)), "twice"},
		{"meta", rawFile(`{"__metadata__":{"k":1}}`, nil), "__metadata__"},
		{"unknown", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}`, make([]byte, 1)), `tensor "w"`},
		{"garbage", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}x`, make([]byte, 1)), "trailing"},
		{"negshape", rawFile(`{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`, nil), "negative"},
		{"overflow", rawFile(`{"w":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`, nil), "overflows"},
	}
	for _, c := range cases {
		path := filepath.Join(dir, c.name+".safetensors")
		if err := os.WriteFile(path, c.file, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := ReadSafetensors(path)
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %q does not name the file and contain %q", c.name, err, c.want)
		}
	}
	// Padding with spaces after the JSON object is allowed.
	path := filepath.Join(dir, "padded.safetensors")
	os.WriteFile(path, rawFile(good+"     ", make([]byte, 8)), 0o644)
	if ts, _, err := ReadSafetensors(path); err != nil || len(ts) != 1 {
		t.Errorf("padded header: %v", err)
	}
}

func FuzzSafetensorsHeader(f *testing.F) {
	var b bytes.Buffer
	EncodeSafetensors(&b, sampleTensors(), map[string]string{"a": "b"})
	raw := b.Bytes()
	n := binary.LittleEndian.Uint64(raw)
	f.Add(raw[8:8+n], int64(len(raw))-8-int64(n))
	f.Add([]byte(`{}`), int64(0))
	f.Add([]byte(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`), int64(8))
	f.Add([]byte(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`), int64(4))
	f.Add([]byte(`{"__metadata__":{"format":"pt"}}  `), int64(0))
	f.Fuzz(func(t *testing.T, hdr []byte, dataLen int64) {
		if dataLen < 0 || dataLen > 1<<20 {
			return
		}
		spans, _, err := parseSafetensorsHeader(hdr, dataLen)
		if err != nil {
			return
		}
		// Whatever parses must tile [0, dataLen) exactly with sizes that
		// match the shapes.
		var off int64
		for _, s := range spans {
			if s.begin != off || s.end < s.begin {
				t.Fatalf("span %q [%d,%d] at offset %d", s.name, s.begin, s.end, off)
			}
			n, err := shapeBytes(s.shape, safetensorsDTypeSize[s.dtype])
			if err != nil || n != s.end-s.begin {
				t.Fatalf("span %q: size %d vs %d (%v)", s.name, n, s.end-s.begin, err)
			}
			off = s.end
		}
		if off != dataLen {
			t.Fatalf("spans cover %d of %d", off, dataLen)
		}
		// And a file built from it decodes to the same tensors.
		file := rawFile(string(hdr), make([]byte, dataLen))
		ts, _, err := DecodeSafetensors(bytes.NewReader(file), int64(len(file)))
		if err != nil || len(ts) != len(spans) {
			t.Fatalf("decode: %d tensors, %v", len(ts), err)
		}
	})
}
