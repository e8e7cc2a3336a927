package ingest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync/atomic"

	"github.com/parquet-go/parquet-go"

	"github.com/spill-ml/spill/dataset"
)

// parquetSource converts a Parquet file, one row group at a time and, within a row
// group, one page (text) or a small batch of rows (records) at a time.
//
// If the file has a column named Options.Field, that column is byte-tokenized, one
// document per non-null value, into tokens. Otherwise every leaf column must be
// numeric (boolean, int32, int64, float, double) and the rows become records.
type parquetSource struct {
	path string
	f    *os.File
	pf   *parquet.File
	s    dataset.Schema

	textCol  int // tokens: leaf index of the text column
	ncols    int // records: leaf columns
	names    []string
	labelIdx int
	labelInt bool
}

// countingReaderAt counts the bytes read through it into n.
type countingReaderAt struct {
	r io.ReaderAt
	n *atomic.Int64
}

func (c countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

func openParquet(path string, o *Options) (source, error) {
	return openWith(path, o, newParquetSource)
}

func newParquetSource(path string, f *os.File, size int64, o *Options) (*parquetSource, error) {
	pf, err := parquet.OpenFile(countingReaderAt{r: f, n: o.BytesRead}, size, parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
	if err != nil {
		return nil, fmt.Errorf("%s: not a readable Parquet file: %w", path, err)
	}
	s := &parquetSource{path: path, f: f, pf: pf, labelInt: o.LabelType == "int32"}
	schema := pf.Schema()
	if leaf, ok := schema.Lookup(o.Field); ok {
		k := leaf.Node.Type().Kind()
		if k != parquet.ByteArray && k != parquet.FixedLenByteArray {
			return nil, fmt.Errorf("%s: column %q has type %s, want a string column for text", path, o.Field, leaf.Node.Type())
		}
		if leaf.MaxRepetitionLevel > 0 {
			return nil, fmt.Errorf("%s: column %q is repeated; want one string per row", path, o.Field)
		}
		s.textCol = leaf.ColumnIndex
		s.s = o.textSchema()
		return s, nil
	}
	var kinds []parquet.Kind
	for _, p := range schema.Columns() {
		leaf, _ := schema.Lookup(p...)
		name := strings.Join(p, ".")
		switch leaf.Node.Type().Kind() {
		case parquet.Boolean, parquet.Int32, parquet.Int64, parquet.Float, parquet.Double:
		default:
			return nil, fmt.Errorf("%s: column %q has type %s: records need numeric columns (or name a text column with --field; no column %q)",
				path, name, leaf.Node.Type(), o.Field)
		}
		if leaf.MaxRepetitionLevel > 0 {
			return nil, fmt.Errorf("%s: column %q is repeated: records need one value per row", path, name)
		}
		s.names = append(s.names, name)
		kinds = append(kinds, leaf.Node.Type().Kind())
	}
	s.ncols = len(s.names)
	if s.ncols < 2 {
		return nil, fmt.Errorf("%s: %d numeric column(s): records need at least 2 (features and a label)", path, s.ncols)
	}
	if s.labelIdx, err = o.pickLabel(s.names, s.ncols); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	lt := o.LabelType
	if lt == "" {
		// As for .npy and CSV: an integer label column holds class ids.
		switch kinds[s.labelIdx] {
		case parquet.Boolean, parquet.Int32, parquet.Int64:
			lt = "int32"
		}
	}
	s.labelInt = lt == "int32"
	s.s = recordsSchema(s.names, s.ncols, s.labelIdx, lt)
	return s, nil
}

func (s *parquetSource) schema() dataset.Schema { return s.s }

func (s *parquetSource) Close() error { return s.f.Close() }

func (s *parquetSource) run(ctx context.Context, e *emitter) error {
	for g, rg := range s.pf.RowGroups() {
		var err error
		if s.s.Kind == dataset.KindTokens {
			err = s.textGroup(ctx, e, rg)
		} else {
			err = s.recordGroup(ctx, e, rg)
		}
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return err
			}
			return fmt.Errorf("%s: row group %d: %w", s.path, g, err)
		}
	}
	return nil
}

func (s *parquetSource) textGroup(ctx context.Context, e *emitter, rg parquet.RowGroup) error {
	pages := rg.ColumnChunks()[s.textCol].Pages()
	defer pages.Close()
	vals := make([]parquet.Value, 256)
	for {
		page, err := pages.ReadPage()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		err = s.textPage(ctx, e, page, vals)
		parquet.Release(page)
		if err != nil {
			return err
		}
	}
}

func (s *parquetSource) textPage(ctx context.Context, e *emitter, page parquet.Page, vals []parquet.Value) error {
	r := page.Values()
	for {
		n, err := r.ReadValues(vals)
		for _, v := range vals[:n] {
			if v.IsNull() {
				continue
			}
			if err := e.beginDoc(ctx); err != nil {
				return err
			}
			if err := e.textBytes(ctx, v.ByteArray()); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (s *parquetSource) recordGroup(ctx context.Context, e *emitter, rg parquet.RowGroup) error {
	rows := rg.Rows()
	defer rows.Close()
	batch := make([]parquet.Row, 256)
	rec := make([]byte, 0, s.ncols*4)
	var rowNo int64
	for {
		n, err := rows.ReadRows(batch)
		for _, row := range batch[:n] {
			if len(row) != s.ncols {
				return fmt.Errorf("row %d: %d values, want %d", rowNo, len(row), s.ncols)
			}
			rec = rec[:0]
			var label []byte
			for _, v := range row {
				c := v.Column()
				if v.IsNull() {
					return fmt.Errorf("row %d: column %q is null", rowNo, s.names[c])
				}
				f := parquetFloat(v)
				if c == s.labelIdx {
					var lerr error
					if label, lerr = encodeLabel(f, s.labelInt); lerr != nil {
						return fmt.Errorf("row %d: column %q (label): %w", rowNo, s.names[c], lerr)
					}
					continue
				}
				rec = binary.LittleEndian.AppendUint32(rec, math.Float32bits(float32(f)))
			}
			rec = append(rec, label...)
			if err := e.record(ctx, rec); err != nil {
				return err
			}
			rowNo++
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

func parquetFloat(v parquet.Value) float64 {
	switch v.Kind() {
	case parquet.Boolean:
		if v.Boolean() {
			return 1
		}
		return 0
	case parquet.Int32:
		return float64(v.Int32())
	case parquet.Int64:
		return float64(v.Int64())
	case parquet.Float:
		return float64(v.Float())
	}
	return v.Double()
}
