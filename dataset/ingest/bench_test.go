package ingest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchConvert converts input b.N times, reporting input bytes per second.
func benchConvert(b *testing.B, input string, o Options) {
	st, err := os.Stat(input)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(st.Size())
	b.ReportAllocs()
	dir := b.TempDir()
	for i := 0; b.Loop(); i++ {
		out := filepath.Join(dir, fmt.Sprint(i))
		if _, err := Convert(context.Background(), out, []string{input}, o); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(out)
	}
}

func BenchmarkConvertBin(b *testing.B) {
	t16, _ := randTokens(8<<20, 50257, 9)
	p := filepath.Join(b.TempDir(), "train.bin")
	os.WriteFile(p, le16(t16...), 0o644)
	benchConvert(b, p, Options{})
}

func BenchmarkConvertJSONL(b *testing.B) {
	var sb strings.Builder
	for i := 0; sb.Len() < 8<<20; i++ {
		fmt.Fprintf(&sb, "{\"id\": %d, \"text\": \"%s\"}\n", i, strings.Repeat("the quick brown fox ", 20))
	}
	p := filepath.Join(b.TempDir(), "docs.jsonl")
	os.WriteFile(p, []byte(sb.String()), 0o644)
	benchConvert(b, p, Options{})
}

func BenchmarkConvertCSV(b *testing.B) {
	var sb strings.Builder
	for i := 0; sb.Len() < 4<<20; i++ {
		fmt.Fprintf(&sb, "%d.25,%d.5,-%d.125,3.75e-2,%d\n", i, i%97, i%13, i%10)
	}
	p := filepath.Join(b.TempDir(), "rows.csv")
	os.WriteFile(p, []byte(sb.String()), 0o644)
	benchConvert(b, p, Options{LabelType: "int32"})
}
