package ingest

import (
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
)

type textRow struct {
	ID   int64   `parquet:"id"`
	Text *string `parquet:"text,optional"`
}

type numRow struct {
	A float32 `parquet:"a"`
	B float64 `parquet:"b"`
	C int32   `parquet:"c"`
	Y int64   `parquet:"y"`
	D bool    `parquet:"d"`
}

func TestParquetText(t *testing.T) {
	dir := t.TempDir()
	var rows []textRow
	var docs []string
	for i := range 300 {
		s := fmt.Sprintf("document %d %s", i, strings.Repeat("ab", i%17))
		if i%50 == 7 {
			rows = append(rows, textRow{ID: int64(i)}) // null: not a document
			continue
		}
		rows = append(rows, textRow{ID: int64(i), Text: &s})
		docs = append(docs, s)
	}
	p := filepath.Join(dir, "docs.parquet")
	// Several row groups and pages, to exercise the streaming paths.
	if err := parquet.WriteFile(p, rows, parquet.MaxRowsPerRowGroup(64), parquet.PageBufferSize(512)); err != nil {
		t.Fatal(err)
	}
	d, _ := convertOK(t, []string{p}, Options{SeqLen: 33})
	if d.Schema().VocabSize != ByteVocab {
		t.Fatalf("schema %+v", d.Schema())
	}
	wantTokens(t, d, byteStream(docs...))
}

func TestParquetRecords(t *testing.T) {
	dir := t.TempDir()
	var rows []numRow
	for i := range 500 {
		rows = append(rows, numRow{A: float32(i) / 4, B: float64(i) * 1.5, C: int32(-i), Y: int64(i % 10), D: i%2 == 0})
	}
	p := filepath.Join(dir, "num.parquet")
	if err := parquet.WriteFile(p, rows, parquet.MaxRowsPerRowGroup(128)); err != nil {
		t.Fatal(err)
	}
	// An int64 label column becomes int32 labels without --label-type,
	// as an integer .npy array does; a float one stays float32.
	d, _ := convertOK(t, []string{p}, Options{LabelCol: "y"})
	if s := d.Schema(); s.LabelDType != "int32" {
		t.Fatalf("int64 label column: label dtype %s, want int32", s.LabelDType)
	}
	if d2, _ := convertOK(t, []string{p}, Options{LabelCol: "b"}); d2.Schema().LabelDType != "float32" {
		t.Fatalf("double label column: label dtype %s, want float32", d2.Schema().LabelDType)
	}
	if d2, _ := convertOK(t, []string{p}, Options{LabelCol: "c"}); d2.Schema().LabelDType != "int32" {
		t.Fatalf("int32 label column: label dtype %s, want int32", d2.Schema().LabelDType)
	}
	s := d.Schema()
	if s.Features != 4 || s.Label != "y" || !reflect.DeepEqual(s.Columns, []string{"a", "b", "c", "d"}) || d.Len() != 500 {
		t.Fatalf("schema %+v, %d records", s, d.Len())
	}
	feats, labels := records(t, d)
	for i, r := range rows {
		dv := float32(0)
		if r.D {
			dv = 1
		}
		want := []uint32{math.Float32bits(r.A), math.Float32bits(float32(r.B)), math.Float32bits(float32(r.C)), math.Float32bits(dv)}
		if !reflect.DeepEqual(feats[i], want) || labels[i] != uint32(r.Y) {
			t.Fatalf("row %d: features %v label %d, want %v %d", i, feats[i], labels[i], want, r.Y)
		}
	}
}

func TestParquetBadInput(t *testing.T) {
	dir := t.TempDir()
	notPq := writeFile(t, dir, "fake.parquet", []byte("this is not parquet"))
	convertFail(t, []string{notPq}, Options{}, "fake.parquet", "not a readable Parquet file")

	type mixed struct {
		Name string  `parquet:"name"`
		X    float32 `parquet:"x"`
	}
	p := filepath.Join(dir, "mixed.parquet")
	if err := parquet.WriteFile(p, []mixed{{"a", 1}}); err != nil {
		t.Fatal(err)
	}
	convertFail(t, []string{p}, Options{}, "mixed.parquet", `column "name"`, "numeric")

	type numText struct {
		Text int32 `parquet:"text"`
	}
	q := filepath.Join(dir, "numtext.parquet")
	if err := parquet.WriteFile(q, []numText{{1}}); err != nil {
		t.Fatal(err)
	}
	convertFail(t, []string{q}, Options{}, "numtext.parquet", `column "text"`, "want a string column")

	type nullable struct {
		X *float32 `parquet:"x,optional"`
		Y float32  `parquet:"y"`
	}
	one := float32(1)
	n := filepath.Join(dir, "null.parquet")
	if err := parquet.WriteFile(n, []nullable{{&one, 1}, {nil, 2}}); err != nil {
		t.Fatal(err)
	}
	convertFail(t, []string{n}, Options{}, "null.parquet", "row 1", `column "x" is null`)
}
