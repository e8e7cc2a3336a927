package ingest

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"
)

// npyBytes builds a .npy file (format 1.0, or 2.0 with v2) around data.
func npyBytes(descr string, fortran bool, shape string, data []byte, v2 bool) []byte {
	fo := "False"
	if fortran {
		fo = "True"
	}
	h := fmt.Sprintf("{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr, fo, shape)
	pre := 10
	if v2 {
		pre = 12
	}
	for (pre+len(h)+1)%64 != 0 {
		h += " "
	}
	h += "\n"
	var b []byte
	b = append(b, "\x93NUMPY"...)
	if v2 {
		b = append(b, 2, 0)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h)))
	} else {
		b = append(b, 1, 0)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(h)))
	}
	b = append(b, h...)
	return append(b, data...)
}

// encodeInts encodes vals as items of size bytes in the given order.
func encodeInts(vals []int64, size int, big bool) []byte {
	var bo binary.AppendByteOrder = binary.LittleEndian
	if big {
		bo = binary.BigEndian
	}
	var b []byte
	for _, v := range vals {
		switch size {
		case 1:
			b = append(b, byte(v))
		case 2:
			b = bo.AppendUint16(b, uint16(v))
		case 4:
			b = bo.AppendUint32(b, uint32(v))
		case 8:
			b = bo.AppendUint64(b, uint64(v))
		}
	}
	return b
}

func TestNPYTokens(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		descr string
		size  int
		max   int64
		want  string // stored token dtype
	}{
		{"|u1", 1, 255, "uint16"},
		{"<u2", 2, 65535, "uint16"},
		{">u2", 2, 65535, "uint16"},
		{"<i2", 2, 32767, "uint16"},
		{"<u4", 4, 100000, "uint32"},
		{"<i4", 4, 100000, "uint32"},
		{"<i8", 8, 1 << 31, "uint32"},
		{">i8", 8, 70000, "uint32"},
	}
	for i, c := range cases {
		t.Run(c.descr, func(t *testing.T) {
			vals := make([]int64, 777)
			want := make([]uint32, len(vals))
			for j := range vals {
				vals[j] = int64(j*7919) % (c.max + 1)
				want[j] = uint32(vals[j])
			}
			vals[5], want[5] = c.max, uint32(c.max)
			data := encodeInts(vals, c.size, c.descr[0] == '>')
			p := writeFile(t, dir, fmt.Sprintf("t%d.npy", i), npyBytes(c.descr, false, "(777,)", data, i%2 == 1))
			d, _ := convertOK(t, []string{p}, Options{SeqLen: 16})
			if got := d.Schema().TokenDType; got != c.want {
				t.Fatalf("token dtype %s, want %s", got, c.want)
			}
			wantTokens(t, d, want)
		})
	}
}

func TestNPYTokenRange(t *testing.T) {
	dir := t.TempDir()
	neg := writeFile(t, dir, "neg.npy", npyBytes("<i8", false, "(4,)", encodeInts([]int64{1, 2, -3, 4}, 8, false), false))
	convertFail(t, []string{neg}, Options{SeqLen: 1}, "neg.npy", "element 2", "token -3 out of range")
	wide := writeFile(t, dir, "wide.npy", npyBytes("<i4", false, "(4,)", encodeInts([]int64{1, 70000, 3, 4}, 4, false), false))
	convertFail(t, []string{wide}, Options{SeqLen: 1, TokenDType: "uint16"}, "wide.npy", "element 1", "token 70000", "uint16")
	// A vocab that fits uint16 narrows wide arrays.
	d, _ := convertOK(t, []string{writeFile(t, dir, "ok.npy", npyBytes("<i8", false, "(4,)", encodeInts([]int64{1, 2, 3, 4}, 8, false), false))},
		Options{SeqLen: 1, Vocab: 50257})
	if d.Schema().TokenDType != "uint16" {
		t.Fatalf("token dtype %s, want uint16 for vocab 50257", d.Schema().TokenDType)
	}
	wantTokens(t, d, []uint32{1, 2, 3, 4})
}

func TestNPYRecords(t *testing.T) {
	dir := t.TempDir()
	const rows, cols = 50, 4
	var f32, f64, i32 []byte
	for r := range rows {
		for c := range cols {
			v := float64(r*cols+c) + 0.5
			if c == 1 {
				v = float64(r % 3) // label column in the tests below
			}
			f32 = binary.LittleEndian.AppendUint32(f32, math.Float32bits(float32(v)))
			f64 = binary.LittleEndian.AppendUint64(f64, math.Float64bits(v))
			i32 = binary.LittleEndian.AppendUint32(i32, uint32(int32(v)))
		}
	}
	shape := fmt.Sprintf("(%d, %d)", rows, cols)
	check := func(t *testing.T, path string, o Options, asInt, intFeat bool) {
		d, _ := convertOK(t, []string{path}, o)
		s := d.Schema()
		if s.Features != cols-1 || d.Len() != rows {
			t.Fatalf("schema %+v, %d records", s, d.Len())
		}
		feats, labels := records(t, d)
		for r := range rows {
			wantLabel := math.Float32bits(float32(r % 3))
			if asInt {
				wantLabel = uint32(r % 3)
			}
			if labels[r] != wantLabel {
				t.Fatalf("row %d label %#x, want %#x", r, labels[r], wantLabel)
			}
			for k, c := range []int{0, 2, 3} {
				v := float64(r*cols+c) + 0.5
				want := math.Float32bits(float32(v))
				if intFeat {
					want = uint32(int32(v))
				}
				if feats[r][k] != want {
					t.Fatalf("row %d feature %d = %#x, want %#x", r, k, feats[r][k], want)
				}
			}
		}
	}
	t.Run("float32", func(t *testing.T) {
		check(t, writeFile(t, dir, "f32.npy", npyBytes("<f4", false, shape, f32, false)), Options{LabelCol: "1"}, false, false)
	})
	t.Run("float64-int-label", func(t *testing.T) {
		check(t, writeFile(t, dir, "f64.npy", npyBytes("<f8", false, shape, f64, true)), Options{LabelCol: "-3", LabelType: "int32"}, true, false)
	})
	t.Run("int32", func(t *testing.T) {
		p := writeFile(t, dir, "i32.npy", npyBytes("<i4", false, shape, i32, false))
		check(t, p, Options{LabelCol: "1"}, true, true)
	})
}

// TestNPYFortranAndInt64: the column-major arrays numpy writes for
// np.asfortranarray (and pandas for many frames), and 2-D int64 arrays
// (numpy's default integer), convert to the same records as the C-order
// int32/float32 array; an integer array gets int32 features and labels.
func TestNPYFortranAndInt64(t *testing.T) {
	dir := t.TempDir()
	const rows, cols = 70000, 3 // more rows than one block of the Fortran reader
	val := func(r, c int) int64 { return int64(r*7+c*3) % 1000 }
	var cI8, fI8, fF4 []byte
	for r := range rows {
		for c := range cols {
			cI8 = binary.LittleEndian.AppendUint64(cI8, uint64(val(r, c)))
		}
	}
	for c := range cols {
		for r := range rows {
			fI8 = binary.LittleEndian.AppendUint64(fI8, uint64(val(r, c)))
			fF4 = binary.LittleEndian.AppendUint32(fF4, math.Float32bits(float32(val(r, c))+0.25))
		}
	}
	shape := fmt.Sprintf("(%d, %d)", rows, cols)
	for _, c := range []struct {
		name    string
		data    []byte
		integer bool
	}{
		{"c_i8.npy", npyBytes("<i8", false, shape, cI8, false), true},
		{"f_i8.npy", npyBytes("<i8", true, shape, fI8, false), true},
		{"f_f4.npy", npyBytes("<f4", true, shape, fF4, false), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, _ := convertOK(t, []string{writeFile(t, dir, c.name, c.data)}, Options{})
			s := d.Schema()
			wantDT := "float32"
			if c.integer {
				wantDT = "int32"
			}
			if s.FeatureDType != wantDT || s.LabelDType != wantDT || s.Features != cols-1 || d.Len() != rows {
				t.Fatalf("schema %+v, %d records", s, d.Len())
			}
			feats, labels := records(t, d)
			enc := func(v int64) uint32 {
				if c.integer {
					return uint32(int32(v))
				}
				return math.Float32bits(float32(v) + 0.25)
			}
			for r := range rows {
				if feats[r][0] != enc(val(r, 0)) || feats[r][1] != enc(val(r, 1)) || labels[r] != enc(val(r, 2)) {
					t.Fatalf("row %d: %v %d", r, feats[r], labels[r])
				}
			}
		})
	}
}

func TestNPYBadInput(t *testing.T) {
	dir := t.TempDir()
	f4 := make([]byte, 24)
	cases := []struct {
		name  string
		data  []byte
		wants []string
	}{
		{"float1d.npy", npyBytes("<f4", false, "(6,)", f4, false), []string{"dtype <f4", "must hold integers"}},
		{"complex.npy", npyBytes("<c8", false, "(3,)", f4, false), []string{"unsupported dtype", "<c8"}},
		{"f2matrix.npy", npyBytes("<f2", false, "(3, 4)", f4, false), []string{"dtype <f2", "float32, float64 or integer"}},
		{"i8big.npy", npyBytes("<i8", true, "(1, 3)", encodeInts([]int64{1, 1 << 40, 0}, 8, false), false), []string{"row 0, column 1", "value 1099511627776 does not fit the int32 features"}},
		{"cube.npy", npyBytes("<f4", false, "(1, 2, 3)", f4, false), []string{"shape [1 2 3]"}},
		{"short.npy", npyBytes("<u2", false, "(20,)", f4, false), []string{"truncated", "needs 40 data bytes, file has 24"}},
		{"magic.npy", []byte("PK\x03\x04 not numpy at all"), []string{"bad magic"}},
		{"header.npy", npyBytes("<u2", false, "[12]", f4, false), []string{"bad .npy header", "shape: want a tuple"}},
		{"struct.npy", []byte(strings.Replace(string(npyBytes("XX", false, "(3,)", nil, false)), "'XX'", "[('a','<i4')]", 1)), []string{"structured dtypes"}},
		{"empty.npy", nil, []string{"not a .npy file"}},
		{"onecol.npy", npyBytes("<f4", false, "(6, 1)", f4, false), []string{"at least 2 columns"}},
		{"label.npy", npyBytes("<f4", false, "(2, 3)", f4, false), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := writeFile(t, dir, c.name, c.data)
			o := Options{SeqLen: 1}
			wants := append([]string{c.name}, c.wants...)
			if c.name == "label.npy" {
				o.LabelCol = "7"
				wants = append(wants, "label column 7 out of range")
			}
			convertFail(t, []string{p}, o, wants...)
		})
	}
}

func TestNPYIntLabelNotIntegral(t *testing.T) {
	var b []byte
	for _, v := range []float32{1, 2.5, 3, 4} {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	p := writeFile(t, t.TempDir(), "frac.npy", npyBytes("<f4", false, "(2, 2)", b, false))
	convertFail(t, []string{p}, Options{LabelType: "int32"}, "frac.npy", "row 0, column 1", "label 2.5 is not an int32")
}
