package ingest

import (
	"math"
	"reflect"
	"testing"
)

func f32bits(vals ...float32) []uint32 {
	out := make([]uint32, len(vals))
	for i, v := range vals {
		out[i] = math.Float32bits(v)
	}
	return out
}

func TestCSVRoundTrip(t *testing.T) {
	dir := t.TempDir()
	withHeader := writeFile(t, dir, "h.csv", []byte("x1, label ,x2\n1.5,1,-2\n 3, 0, 4e2\n\"5\",2,6\n"))
	noHeader := writeFile(t, dir, "n.csv", []byte("7,1,8\n9,0,10\n"))

	t.Run("header+int-label", func(t *testing.T) {
		d, _ := convertOK(t, []string{withHeader, noHeader}, Options{LabelCol: "label", LabelType: "int32"})
		s := d.Schema()
		if s.Features != 2 || s.LabelDType != "int32" || s.Label != "label" || !reflect.DeepEqual(s.Columns, []string{"x1", "x2"}) {
			t.Fatalf("schema %+v", s)
		}
		feats, labels := records(t, d)
		wantF := [][]uint32{f32bits(1.5, -2), f32bits(3, 400), f32bits(5, 6), f32bits(7, 8), f32bits(9, 10)}
		if !reflect.DeepEqual(feats, wantF) || !reflect.DeepEqual(labels, []uint32{1, 0, 2, 1, 0}) {
			t.Fatalf("features %v labels %v", feats, labels)
		}
	})
	t.Run("no-header+default-label", func(t *testing.T) {
		// The first row's label is an integer: int32 labels, as for an
		// integer .npy or Parquet column.
		d, _ := convertOK(t, []string{noHeader}, Options{})
		s := d.Schema()
		if s.Features != 2 || s.LabelDType != "int32" || s.Label != "" || s.Columns != nil {
			t.Fatalf("schema %+v", s)
		}
		feats, labels := records(t, d)
		if !reflect.DeepEqual(feats, [][]uint32{f32bits(7, 1), f32bits(9, 0)}) || !reflect.DeepEqual(labels, []uint32{8, 10}) {
			t.Fatalf("features %v labels %v", feats, labels)
		}
	})
	t.Run("float-label", func(t *testing.T) {
		p := writeFile(t, dir, "f.csv", []byte("7,1,8.5\n9,0,10\n"))
		d, _ := convertOK(t, []string{p}, Options{})
		if _, labels := records(t, d); d.Schema().LabelDType != "float32" || !reflect.DeepEqual(labels, f32bits(8.5, 10)) {
			t.Fatalf("schema %+v, labels %v", d.Schema(), labels)
		}
	})
	t.Run("forced-header", func(t *testing.T) {
		d, _ := convertOK(t, []string{noHeader}, Options{Header: HeaderYes, LabelCol: "0"})
		if s := d.Schema(); d.Len() != 1 || s.Label != "7" {
			t.Fatalf("schema %+v, %d records; want the numeric first row as header", s, d.Len())
		}
	})
}

func TestCSVBadInput(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, data string
		o          Options
		wants      []string
	}{
		{"trunc.csv", "a,b,c\n1,2,3\n4,5\n", Options{}, []string{"trunc.csv:3:4:", "truncated row: 2 fields, want 3"}},
		{"extra.csv", "1,2\n3,4,5\n", Options{}, []string{"extra.csv:2:6:", "extra fields: 3 fields, want 2"}},
		{"nonnum.csv", "a,b,c\n1,2,3\n4,x5,6\n", Options{}, []string{"nonnum.csv:3:3:", `column 2 ("b")`, `"x5" is not a number`}},
		{"empty-field.csv", "1,,3\n", Options{Header: HeaderNo}, []string{"empty-field.csv:1:3:", "column 2", "empty field is not a number"}},
		{"quote.csv", "1,2\n3,\"4\n", Options{}, []string{"quote.csv:2:", "extraneous or missing \" in quoted-field"}},
		{"label.csv", "1,2.5\n", Options{LabelType: "int32"}, []string{"label.csv:1:3:", "column 2 (label)", "label 2.5 is not an int32"}},
		{"badlabel.csv", "1,zz\n", Options{Header: HeaderNo, LabelType: "float32"}, []string{"badlabel.csv:1:3:", `"zz" is not a number`}},
		{"intthenfloat.csv", "1,2\n3,4.5\n", Options{}, []string{"intthenfloat.csv:2:3:", "label 4.5 is not an int32", "--label-type float32"}},
		{"nocol.csv", "a,b\n1,2\n", Options{LabelCol: "y"}, []string{"nocol.csv", `label column "y" not found (columns: a, b)`}},
		{"one.csv", "1\n2\n", Options{}, []string{"one.csv:1:", "at least 2"}},
		{"blank.csv", "", Options{}, []string{"blank.csv", "empty CSV file"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := writeFile(t, dir, c.name, []byte(c.data))
			convertFail(t, []string{p}, c.o, c.wants...)
		})
	}
	// A later file must have the same number of columns.
	a := writeFile(t, dir, "a.csv", []byte("1,2,3\n"))
	b := writeFile(t, dir, "b.csv", []byte("1,2\n"))
	convertFail(t, []string{a, b}, Options{}, "b.csv", "1 feature columns, want 2")
}

// TestCSVStringLabels: a label column of names (iris's species) becomes
// int32 class ids in order of first appearance, over all inputs, and the
// names go into the manifest.
func TestCSVStringLabels(t *testing.T) {
	dir := t.TempDir()
	a := writeFile(t, dir, "a.csv", []byte("sepal,petal,species\n5.1,1.4,setosa\n7.0,4.7,versicolor\n4.9,1.4,setosa\n"))
	b := writeFile(t, dir, "b.csv", []byte("6.3,6.0,virginica\n5.0,1.3,setosa\n"))
	d, m := convertOK(t, []string{a, b}, Options{})
	s := d.Schema()
	if s.LabelDType != "int32" || s.Label != "species" || !reflect.DeepEqual(s.LabelClasses, []string{"setosa", "versicolor", "virginica"}) ||
		!reflect.DeepEqual(m.Schema.LabelClasses, s.LabelClasses) {
		t.Fatalf("schema %+v", s)
	}
	if _, labels := records(t, d); !reflect.DeepEqual(labels, []uint32{0, 1, 0, 2, 0}) {
		t.Fatalf("labels %v", labels)
	}
}
