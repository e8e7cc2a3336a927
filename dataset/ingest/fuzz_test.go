package ingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spill-ml/spill/dataset"
)

// fuzzConvert converts data (as a file called name) and checks what any
// input must satisfy: no panic; on failure an error naming the file and
// nothing left at the output; on success a dataset that verifies and holds
// at most max samples.
func fuzzConvert(t *testing.T, name string, data []byte, o Options, max int64) {
	dir := t.TempDir()
	in := filepath.Join(dir, name)
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	m, err := Convert(context.Background(), out, []string{in}, o)
	if err != nil {
		if !strings.Contains(err.Error(), name) && !strings.Contains(err.Error(), "inputs hold") {
			t.Fatalf("error %q does not name the input", err)
		}
		if _, serr := os.Stat(out); serr == nil {
			t.Fatalf("failed conversion left %s", out)
		}
		return
	}
	if m.Samples > max {
		t.Fatalf("%d samples from %d input bytes", m.Samples, len(data))
	}
	d, err := dataset.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Verify(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
}

func FuzzNPY(f *testing.F) {
	var f4, i8 []byte
	for i := range 12 {
		f4 = binary.LittleEndian.AppendUint32(f4, math.Float32bits(float32(i%3)))
		i8 = binary.LittleEndian.AppendUint64(i8, uint64(i%5))
	}
	f.Add(npyBytes("<u2", false, "(12,)", encodeInts([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 2, false), false))
	f.Add(npyBytes(">i4", false, "(3,)", encodeInts([]int64{70000, 1, 2}, 4, true), true))
	f.Add(npyBytes("<f4", false, "(4, 3)", f4, false))
	f.Add(npyBytes("<f4", true, "(6, 2)", f4, false))
	f.Add(npyBytes("<i8", true, "(4, 3)", i8, false))
	f.Add(npyBytes("<i8", false, "(2, 6)", i8, true))
	f.Add(npyBytes("<f8", false, "(3, 2)", i8[:48], false))
	f.Add([]byte("\x93NUMPY\x01\x00\x10\x00{'descr': '<u2'}"))
	f.Add(npyBytes("<f8", false, "(0, 1000000000000)", nil, false)) // no rows, huge rows: refused, nothing allocated
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		fuzzConvert(t, "a.npy", data, Options{SeqLen: 2}, int64(len(data)))
	})
}

func FuzzCSV(f *testing.F) {
	for _, s := range []string{
		"x1,label,x2\n1.5,1,-2\n 3, 0, 4e2\n\"5\",2,6\n",
		"sepal,petal,species\n5.1,1.4,setosa\n7.0,4.7,versicolor\n",
		"5.1,1.4,setosa\n6.3,6.0,virginica\n",
		"1,2.5\n3,4\n",
		"1,2\n3,4.5\n",
		"1,2\n3,\"4\n",
		"a,b,c\n1,2,3\n4,5\n",
		"1\n",
		"",
	} {
		f.Add([]byte(s), "")
		f.Add([]byte(s), "0")
	}
	f.Fuzz(func(t *testing.T, data []byte, labelCol string) {
		if len(data) > 1<<16 {
			return
		}
		fuzzConvert(t, "a.csv", data, Options{LabelCol: labelCol}, int64(bytes.Count(data, []byte("\n"))+1))
	})
}
