package ingest

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/spill-ml/spill/dataset"
)

// npyHeader is the parsed header of a .npy file (format versions 1.0, 2.0 and 3.0).
type npyHeader struct {
	kind      byte // 'u', 'i' or 'f'
	size      int  // item size in bytes
	bigEndian bool
	descr     string
	fortran   bool
	shape     []int64
	dataOff   int64 // offset of the array data in the file
}

// readNPYHeader reads and checks the header at the start of r.
func readNPYHeader(r io.Reader) (*npyHeader, error) {
	var pre [10]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return nil, fmt.Errorf("not a .npy file: %w", noEOF(err))
	}
	if string(pre[:6]) != "\x93NUMPY" {
		return nil, errors.New("not a .npy file (bad magic)")
	}
	major := pre[6]
	var hlen, off int64
	switch major {
	case 1:
		hlen, off = int64(binary.LittleEndian.Uint16(pre[8:])), 10
	case 2, 3:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, fmt.Errorf("truncated .npy header: %w", noEOF(err))
		}
		hlen, off = int64(binary.LittleEndian.Uint32([]byte{pre[8], pre[9], b[0], b[1]})), 12
	default:
		return nil, fmt.Errorf("unsupported .npy format version %d.%d", major, pre[7])
	}
	if hlen > 1<<20 {
		return nil, fmt.Errorf("bad .npy header: length %d", hlen)
	}
	text := make([]byte, hlen)
	if _, err := io.ReadFull(r, text); err != nil {
		return nil, fmt.Errorf("truncated .npy header: %w", noEOF(err))
	}
	h, err := parseNPYDict(string(text))
	if err != nil {
		return nil, fmt.Errorf("bad .npy header %q: %w", strings.TrimSpace(string(text)), err)
	}
	h.dataOff = off + hlen
	return h, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// parseNPYDict parses the Python dict literal of a .npy header, for example
// {'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }.
func parseNPYDict(s string) (*npyHeader, error) {
	p := &pyParser{s: s}
	p.space()
	if !p.eat('{') {
		return nil, errors.New("want '{'")
	}
	h := &npyHeader{}
	seen := map[string]bool{}
	for {
		p.space()
		if p.eat('}') {
			break
		}
		key, err := p.str()
		if err != nil {
			return nil, err
		}
		p.space()
		if !p.eat(':') {
			return nil, fmt.Errorf("want ':' after %q", key)
		}
		p.space()
		switch key {
		case "descr":
			if p.peek() == '[' {
				return nil, errors.New("structured dtypes are not supported")
			}
			if h.descr, err = p.str(); err != nil {
				return nil, err
			}
		case "fortran_order":
			switch {
			case strings.HasPrefix(p.s[p.i:], "True"):
				h.fortran, p.i = true, p.i+4
			case strings.HasPrefix(p.s[p.i:], "False"):
				p.i += 5
			default:
				return nil, errors.New("fortran_order: want True or False")
			}
		case "shape":
			if h.shape, err = p.tuple(); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("unknown key %q", key)
		}
		seen[key] = true
		p.space()
		if !p.eat(',') {
			p.space()
			if !p.eat('}') {
				return nil, errors.New("want ',' or '}'")
			}
			break
		}
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if !seen[k] {
			return nil, fmt.Errorf("missing key %q", k)
		}
	}
	d := h.descr
	if len(d) < 3 {
		return nil, fmt.Errorf("unsupported dtype %q", d)
	}
	switch d[0] {
	case '<', '|', '=':
	case '>':
		h.bigEndian = true
	default:
		return nil, fmt.Errorf("unsupported dtype %q", d)
	}
	h.kind = d[1]
	size, err := strconv.Atoi(d[2:])
	if err != nil || (h.kind != 'u' && h.kind != 'i' && h.kind != 'f') || (size != 1 && size != 2 && size != 4 && size != 8) {
		return nil, fmt.Errorf("unsupported dtype %q", d)
	}
	h.size = size
	return h, nil
}

type pyParser struct {
	s string
	i int
}

func (p *pyParser) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\n' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *pyParser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *pyParser) eat(c byte) bool {
	if p.peek() == c {
		p.i++
		return true
	}
	return false
}

func (p *pyParser) str() (string, error) {
	q := p.peek()
	if q != '\'' && q != '"' {
		return "", errors.New("want a quoted string")
	}
	end := strings.IndexByte(p.s[p.i+1:], q)
	if end < 0 {
		return "", errors.New("unterminated string")
	}
	v := p.s[p.i+1 : p.i+1+end]
	p.i += end + 2
	return v, nil
}

func (p *pyParser) tuple() ([]int64, error) {
	if !p.eat('(') {
		return nil, errors.New("shape: want a tuple")
	}
	var dims []int64
	for {
		p.space()
		if p.eat(')') {
			return dims, nil
		}
		j := p.i
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
		}
		// Python 2 era writers may append L to longs.
		n, err := strconv.ParseInt(p.s[j:p.i], 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("shape: bad dimension %q", p.s[j:p.i])
		}
		p.eat('L')
		dims = append(dims, n)
		p.space()
		if !p.eat(',') {
			p.space()
			if !p.eat(')') {
				return nil, errors.New("shape: want ',' or ')'")
			}
			return dims, nil
		}
	}
}

// npySource streams a .npy array: 1-D integer arrays become tokens, 2-D numeric
// arrays become records.
type npySource struct {
	path string
	f    *os.File
	r    *bufio.Reader
	h    *npyHeader
	s    dataset.Schema
	o    *Options

	labelIdx int // records: label column
	labelInt bool
}

func openNPY(path string, o *Options) (source, error) {
	return openWith(path, o, newNPYSource)
}

func newNPYSource(path string, f *os.File, size int64, o *Options) (*npySource, error) {
	r := bufio.NewReaderSize(countingReader{r: f, n: o.BytesRead}, 1<<20)
	h, err := readNPYHeader(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s := &npySource{path: path, f: f, r: r, h: h, o: o}
	elems := int64(1)
	for _, d := range h.shape {
		if d != 0 && elems > math.MaxInt64/int64(h.size)/d {
			return nil, fmt.Errorf("%s: shape %v is too large", path, h.shape)
		}
		elems *= d
	}
	if want := elems * int64(h.size); size-h.dataOff != want {
		return nil, fmt.Errorf("%s: truncated or padded array: shape %v of %s needs %d data bytes, file has %d",
			path, h.shape, h.descr, want, size-h.dataOff)
	}
	switch len(h.shape) {
	case 1:
		if h.kind == 'f' {
			return nil, fmt.Errorf("%s: dtype %s: a 1-D token array must hold integers (u1, u2, i2, u4, i4, i8)", path, h.descr)
		}
		dt := "uint16"
		if h.size > 2 {
			dt = "uint32"
		}
		s.s = dataset.Schema{Kind: dataset.KindTokens, TokenDType: dt}
	case 2:
		// Fortran order (column-major, as np.asfortranarray and many
		// pandas .to_numpy() results are) is read column by column in
		// blocks of rows: see recordBlock.
		if h.kind == 'f' && h.size != 4 && h.size != 8 {
			return nil, fmt.Errorf("%s: dtype %s: a 2-D records array must be float32, float64 or integer", path, h.descr)
		}
		cols := h.shape[1]
		if cols < 2 {
			return nil, fmt.Errorf("%s: shape %v: records need at least 2 columns (features and a label)", path, h.shape)
		}
		idx, err := o.pickLabel(nil, int(cols))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		s.labelIdx = idx
		ft := "float32"
		if h.kind != 'f' {
			ft = "int32"
		}
		lt := o.LabelType
		if lt == "" {
			lt = ft
		}
		s.labelInt = lt == "int32"
		s.s = dataset.Schema{Kind: dataset.KindRecords, FeatureDType: ft, Features: int(cols) - 1, LabelDType: lt}
	default:
		return nil, fmt.Errorf("%s: shape %v: want a 1-D token array or a 2-D records array", path, h.shape)
	}
	return s, nil
}

func (s *npySource) schema() dataset.Schema { return s.s }

func (s *npySource) Close() error { return s.f.Close() }

func (s *npySource) order() binary.ByteOrder {
	if s.h.bigEndian {
		return binary.BigEndian
	}
	return binary.LittleEndian
}

// intAt decodes the integer item at b.
func (s *npySource) intAt(b []byte) (int64, bool) {
	bo := s.order()
	switch int(s.h.kind)<<4 | s.h.size {
	case 'u'<<4 | 1:
		return int64(b[0]), true
	case 'i'<<4 | 1:
		return int64(int8(b[0])), true
	case 'u'<<4 | 2:
		return int64(bo.Uint16(b)), true
	case 'i'<<4 | 2:
		return int64(int16(bo.Uint16(b))), true
	case 'u'<<4 | 4:
		return int64(bo.Uint32(b)), true
	case 'i'<<4 | 4:
		return int64(int32(bo.Uint32(b))), true
	case 'i'<<4 | 8:
		return int64(bo.Uint64(b)), true
	case 'u'<<4 | 8:
		v := bo.Uint64(b)
		if v > math.MaxInt64 {
			return -1, true
		}
		return int64(v), true
	}
	return 0, false
}

func (s *npySource) run(ctx context.Context, e *emitter) error {
	if s.s.Kind == dataset.KindTokens {
		return s.runTokens(ctx, e)
	}
	return s.runRecords(ctx, e)
}

func (s *npySource) runTokens(ctx context.Context, e *emitter) error {
	n := s.h.shape[0]
	isz := s.h.size
	if s.h.kind == 'u' && isz == 2 && !s.h.bigEndian {
		// The stored layout already: no per-token decoding unless widening or checking.
		return s.copyRaw16(ctx, e, n)
	}
	const batch = 64 << 10
	raw := make([]byte, batch*isz)
	vals := make([]int64, batch)
	for done := int64(0); done < n; {
		k := int(min(int64(batch), n-done))
		if _, err := io.ReadFull(s.r, raw[:k*isz]); err != nil {
			return fmt.Errorf("%s: %w", s.path, noEOF(err))
		}
		for i := range k {
			v, _ := s.intAt(raw[i*isz:])
			vals[i] = v
		}
		if err := e.tokenValues(ctx, vals[:k], done); err != nil {
			return err
		}
		done += int64(k)
	}
	return nil
}

func (s *npySource) copyRaw16(ctx context.Context, e *emitter, n int64) error {
	buf := make([]byte, binReadSize)
	for done := int64(0); done < n; {
		k := min(int64(len(buf)/2), n-done)
		if _, err := io.ReadFull(s.r, buf[:2*k]); err != nil {
			return fmt.Errorf("%s: %w", s.path, noEOF(err))
		}
		if err := e.rawTokens16(ctx, buf[:2*k], done); err != nil {
			return err
		}
		done += k
	}
	return nil
}

// recordBlockBytes bounds the memory of one block of rows of a records
// array (and so of a Fortran-order array's transpose buffer).
const recordBlockBytes = 1 << 20

// recordBlock reads rows [r0, r0+n) of a 2-D array into buf in row-major
// order. A C-order array is read sequentially; a Fortran-order one with
// one ReadAt per column (each column's n items are contiguous).
func (s *npySource) recordBlock(r0, n int64, buf, col []byte) error {
	rows, cols, isz := s.h.shape[0], int(s.h.shape[1]), s.h.size
	if !s.h.fortran {
		if _, err := io.ReadFull(s.r, buf[:n*int64(cols*isz)]); err != nil {
			return fmt.Errorf("%s: rows %d..%d: %w", s.path, r0, r0+n-1, noEOF(err))
		}
		return nil
	}
	for c := range cols {
		off := s.h.dataOff + (int64(c)*rows+r0)*int64(isz)
		m, err := s.f.ReadAt(col[:n*int64(isz)], off)
		s.o.BytesRead.Add(int64(m))
		if err != nil {
			return fmt.Errorf("%s: column %d, rows %d..%d: %w", s.path, c, r0, r0+n-1, noEOF(err))
		}
		for r := range n {
			copy(buf[(r*int64(cols)+int64(c))*int64(isz):][:isz], col[r*int64(isz):][:isz])
		}
	}
	return nil
}

func (s *npySource) runRecords(ctx context.Context, e *emitter) error {
	rows, cols := s.h.shape[0], int(s.h.shape[1])
	if rows == 0 {
		return nil
	}
	isz := s.h.size
	rowBytes := int64(cols * isz)
	block := max(1, recordBlockBytes/rowBytes)
	buf := make([]byte, min(block, max(rows, 1))*rowBytes)
	var col []byte
	if s.h.fortran {
		col = make([]byte, min(block, max(rows, 1))*int64(isz))
	}
	rec := make([]byte, cols*4)
	bo := s.order()
	for r0 := int64(0); r0 < rows; r0 += block {
		n := min(block, rows-r0)
		if err := s.recordBlock(r0, n, buf, col); err != nil {
			return err
		}
		for k := range n {
			row := r0 + k
			raw := buf[k*rowBytes:]
			out := rec[:0]
			var label []byte
			for c := range cols {
				b := raw[c*isz:]
				var f float64
				var iv int64
				if s.h.kind == 'f' {
					if isz == 4 {
						f = float64(math.Float32frombits(bo.Uint32(b)))
					} else {
						f = math.Float64frombits(bo.Uint64(b))
					}
				} else {
					iv, _ = s.intAt(b)
					if s.h.kind == 'u' && s.h.size == 8 && iv < 0 {
						iv = math.MaxInt64 // above int64: reported as out of int32 range below
					}
					f = float64(iv)
				}
				if c == s.labelIdx {
					var err error
					if label, err = encodeLabel(f, s.labelInt); err != nil {
						return fmt.Errorf("%s: row %d, column %d: %w", s.path, row, c, err)
					}
					continue
				}
				if s.h.kind != 'f' {
					if iv < math.MinInt32 || iv > math.MaxInt32 {
						return fmt.Errorf("%s: row %d, column %d: value %d does not fit the int32 features of the dataset", s.path, row, c, iv)
					}
					out = binary.LittleEndian.AppendUint32(out, uint32(int32(iv)))
				} else {
					out = binary.LittleEndian.AppendUint32(out, math.Float32bits(float32(f)))
				}
			}
			out = append(out, label...)
			if err := e.record(ctx, out); err != nil {
				return err
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// encodeLabel returns the 4 little-endian bytes of a label value.
func encodeLabel(v float64, asInt bool) ([]byte, error) {
	if !asInt {
		return binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(v))), nil
	}
	if v != math.Trunc(v) || v < math.MinInt32 || v > math.MaxInt32 {
		return nil, fmt.Errorf("label %v is not an int32", v)
	}
	return binary.LittleEndian.AppendUint32(nil, uint32(int32(v))), nil
}

// pickLabel resolves o.LabelCol for an input with ncols columns and the given
// column names (nil when it has none). The first input that resolves a name
// fixes the index used for later inputs without names.
func (o *Options) pickLabel(names []string, ncols int) (int, error) {
	i, err := pickLabel(o.LabelCol, names, ncols)
	if err != nil && names == nil && o.labelIdx > 0 {
		return o.labelIdx - 1, nil
	}
	if err == nil && o.labelIdx == 0 {
		o.labelIdx = i + 1
	}
	return i, err
}

// pickLabel resolves a --label-col value against the column names (nil when the
// input has none) of ncols columns: a name, or a 0-based index (negative counts
// from the end); "" is the last column.
func pickLabel(spec string, names []string, ncols int) (int, error) {
	if spec == "" {
		return ncols - 1, nil
	}
	for i, n := range names {
		if n == spec {
			return i, nil
		}
	}
	i, err := strconv.Atoi(spec)
	if err != nil {
		if names == nil {
			return 0, fmt.Errorf("label column %q: the input has no column names; give a 0-based index", spec)
		}
		return 0, fmt.Errorf("label column %q not found (columns: %s)", spec, strings.Join(names, ", "))
	}
	if i < 0 {
		i += ncols
	}
	if i < 0 || i >= ncols {
		return 0, fmt.Errorf("label column %s out of range for %d columns", spec, ncols)
	}
	return i, nil
}
