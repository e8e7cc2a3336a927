package ingest

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/spill-ml/spill/dataset"
)

// csvSource converts a CSV file of numeric columns into records: every column but the
// label becomes a float32 feature, the label is stored last as float32 or int32.
//
// Without Options.LabelType the label type comes from the first data row's label,
// as the column types of .npy and Parquet decide it there: an integer is an int32
// class id, another number a float32, and anything else a class name, mapped to
// int32 ids in order of first appearance over all inputs (the names go into the
// manifest's label_classes).
type csvSource struct {
	path     string
	f        *os.File
	r        *csv.Reader
	names    []string // column names from the header, nil without one
	ncols    int
	labelIdx int
	labelInt bool
	classes  bool     // string labels mapped to class ids (o.classID)
	o        *Options //
	pending  []string // first data row, read while looking for a header
	s        dataset.Schema
}

func openCSV(path string, o *Options) (source, error) {
	return openWith(path, o, newCSVSource)
}

func newCSVSource(path string, f *os.File, _ int64, o *Options) (*csvSource, error) {
	r := csv.NewReader(bufio.NewReaderSize(countingReader{r: f, n: o.BytesRead}, 1<<20))
	r.FieldsPerRecord = -1 // checked here, to report truncated rows with a position
	r.ReuseRecord = true
	r.TrimLeadingSpace = true
	s := &csvSource{path: path, f: f, r: r, labelInt: o.LabelType == "int32", o: o}
	first, err := r.Read()
	if err == io.EOF {
		return nil, fmt.Errorf("%s: empty CSV file", path)
	}
	if err != nil {
		return nil, s.csvErr(err)
	}
	first = append([]string(nil), first...)
	header := o.Header == HeaderYes
	if o.Header == HeaderAuto {
		// A header row has names; a data row has numbers and at most one
		// name, its string label ("5.1,3.5,1.4,0.2,setosa").
		names := 0
		for _, fld := range first {
			if _, err := strconv.ParseFloat(strings.TrimSpace(fld), 64); err != nil {
				names++
			}
		}
		header = names >= 2 || names == len(first)
	}
	s.ncols = len(first)
	if header {
		for i := range first {
			first[i] = strings.TrimSpace(first[i])
		}
		s.names = first
	} else {
		s.pending = first
	}
	if s.ncols < 2 {
		return nil, fmt.Errorf("%s:1: %d column(s): records need at least 2 (features and a label)", path, s.ncols)
	}
	if s.labelIdx, err = o.pickLabel(s.names, s.ncols); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	lt := o.LabelType
	switch {
	case o.classes != nil: // an earlier input had class names
		lt, s.classes = "int32", true
	case lt == "":
		if s.pending == nil {
			row, err := r.Read()
			if err != nil && err != io.EOF {
				return nil, s.csvErr(err)
			}
			if err == nil {
				s.pending = append([]string(nil), row...)
			}
		}
		lt = "float32"
		if s.pending != nil && s.labelIdx < len(s.pending) {
			v := strings.TrimSpace(s.pending[s.labelIdx])
			if _, err := strconv.ParseInt(v, 10, 32); err == nil {
				lt = "int32"
			} else if _, err := strconv.ParseFloat(v, 64); err != nil {
				lt, s.classes = "int32", true
				o.classes = map[string]int32{}
			}
		}
	}
	s.labelInt = lt == "int32"
	s.s = recordsSchema(s.names, s.ncols, s.labelIdx, lt)
	return s, nil
}

func (s *csvSource) schema() dataset.Schema { return s.s }

func (s *csvSource) Close() error { return s.f.Close() }

// csvErr turns a csv.Reader error into one that names the file, line and column.
func (s *csvSource) csvErr(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s:%d:%d: %v", s.path, pe.Line, pe.Column, pe.Err)
	}
	return fmt.Errorf("%s: %w", s.path, err)
}

func (s *csvSource) colName(i int) string {
	if s.names != nil {
		return fmt.Sprintf("column %d (%q)", i+1, s.names[i])
	}
	return fmt.Sprintf("column %d", i+1)
}

func (s *csvSource) run(ctx context.Context, e *emitter) error {
	rec := make([]byte, 0, s.ncols*4)
	row := s.pending
	for n := 0; ; n++ {
		if row == nil {
			var err error
			row, err = s.r.Read()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return s.csvErr(err)
			}
		}
		if len(row) != s.ncols {
			line, col := s.r.FieldPos(len(row) - 1)
			col += len(row[len(row)-1])
			what := "truncated row"
			if len(row) > s.ncols {
				what = "extra fields"
			}
			return fmt.Errorf("%s:%d:%d: %s: %d fields, want %d", s.path, line, col, what, len(row), s.ncols)
		}
		rec = rec[:0]
		var label []byte
		for i, fld := range row {
			fld = strings.TrimSpace(fld)
			if i == s.labelIdx && s.classes {
				id, err := s.o.classID(fld)
				if err != nil {
					line, col := s.r.FieldPos(i)
					return fmt.Errorf("%s:%d:%d: %s (label): %w", s.path, line, col, s.colName(i), err)
				}
				label = binary.LittleEndian.AppendUint32(nil, uint32(id))
				continue
			}
			if i == s.labelIdx {
				var err error
				if label, err = parseLabel(fld, s.labelInt); err != nil {
					if s.labelInt && s.o.LabelType == "" {
						err = fmt.Errorf("%w (the first row's label was an integer, so labels are int32 class ids; pass --label-type float32 for real-valued labels)", err)
					}
					line, col := s.r.FieldPos(i)
					return fmt.Errorf("%s:%d:%d: %s (label): %w", s.path, line, col, s.colName(i), err)
				}
				continue
			}
			v, err := strconv.ParseFloat(fld, 32)
			if err != nil && !errors.Is(err, strconv.ErrRange) {
				line, col := s.r.FieldPos(i)
				return fmt.Errorf("%s:%d:%d: %s: %s is not a number", s.path, line, col, s.colName(i), quoteField(fld))
			}
			rec = binary.LittleEndian.AppendUint32(rec, math.Float32bits(float32(v)))
		}
		rec = append(rec, label...)
		if err := e.record(ctx, rec); err != nil {
			return err
		}
		row = nil
		if n&0xfff == 0xfff {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
}

func quoteField(s string) string {
	if s == "" {
		return "empty field"
	}
	return strconv.Quote(s)
}

// parseLabel parses a label field as float32 or, with asInt, int32 (an integral
// float such as "3.0" is accepted).
func parseLabel(s string, asInt bool) ([]byte, error) {
	if asInt {
		if v, err := strconv.ParseInt(s, 10, 32); err == nil {
			return binary.LittleEndian.AppendUint32(nil, uint32(int32(v))), nil
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return nil, fmt.Errorf("%s is not a number", quoteField(s))
	}
	return encodeLabel(v, asInt)
}
