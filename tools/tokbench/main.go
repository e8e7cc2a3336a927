// Command tokbench measures spill's tokenizers against Hugging Face
// tokenizers (tools/tokbench/bench.sh runs both on the same text).
//
//	tokbench encode -tokenizer T -in docs.jsonl -threads N -out ids.bin
//	    encodes the "text" field of each line with N goroutines (documents
//	    handed out in order, EOT between them) and prints one JSON object:
//	    bytes, tokens, seconds (encoding only, the input already in memory)
//	tokbench dump DIR out.bin
//	    writes the token stream of a spill dataset as little-endian uint32
//	tokbench compare a.bin b.bin
//	    compares two uint32 id files and prints the length of their common
//	    prefix (a dataset drops the tokens of a last partial sample)
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/dataset/tokenize"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: tokbench encode|dump|compare ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "encode":
		err = encode(os.Args[2:])
	case "dump":
		err = dump(os.Args[2:])
	case "compare":
		err = compare(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tokbench:", err)
		os.Exit(1)
	}
}

func readDocs(path string) ([][]byte, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	var docs [][]byte
	var n int64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	for sc.Scan() {
		var d struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			return nil, 0, fmt.Errorf("%s:%d: %v", path, len(docs)+1, err)
		}
		docs = append(docs, []byte(d.Text))
		n += int64(len(d.Text))
	}
	return docs, n, sc.Err()
}

func encode(args []string) error {
	fs := flag.NewFlagSet("encode", flag.ExitOnError)
	name := fs.String("tokenizer", "", "tokenizer name or tokenizer.json")
	in := fs.String("in", "", "JSONL documents")
	threads := fs.Int("threads", 1, "goroutines")
	out := fs.String("out", "", "ids file (uint32 LE; optional)")
	fs.Parse(args)
	tk, err := tokenize.Open(*name)
	if err != nil {
		return err
	}
	docs, nbytes, err := readDocs(*in)
	if err != nil {
		return err
	}
	ids := make([][]uint32, len(docs))
	next := make(chan int, 1024)
	var wg sync.WaitGroup
	start := time.Now()
	for range *threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			enc := tk.NewEncoder()
			for i := range next {
				ids[i] = enc.Encode(nil, docs[i])
			}
		}()
	}
	for i := range docs {
		next <- i
	}
	close(next)
	wg.Wait()
	secs := time.Since(start).Seconds()
	var ntok int64
	for _, x := range ids {
		ntok += int64(len(x))
	}
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		w := bufio.NewWriterSize(f, 1<<20)
		for i, x := range ids {
			if i > 0 {
				binary.Write(w, binary.LittleEndian, tk.EOT())
			}
			if err := binary.Write(w, binary.LittleEndian, x); err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"tokenizer": tk.Name(), "threads": *threads, "docs": len(docs),
		"bytes": nbytes, "tokens": ntok, "seconds": secs, "tokens_per_s": float64(ntok) / secs})
}

func dump(args []string) error {
	if len(args) != 2 {
		return errors.New("dump DIR out.bin")
	}
	d, err := dataset.Open(args[0])
	if err != nil {
		return err
	}
	defer d.Close()
	s := d.Schema()
	ts, T := s.TokenSize(), s.SeqLen
	f, err := os.Create(args[1])
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	buf := make([]byte, d.SampleSize())
	tok := func(b []byte, j int) uint32 {
		if ts == 2 {
			return uint32(binary.LittleEndian.Uint16(b[2*j:]))
		}
		return binary.LittleEndian.Uint32(b[4*j:])
	}
	for i := int64(0); i < d.Len(); i++ {
		b, err := d.Sample(i, buf)
		if err != nil {
			return err
		}
		n := T
		if i == d.Len()-1 {
			n = T + 1
		}
		for j := range n {
			binary.Write(w, binary.LittleEndian, tok(b, j))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

func compare(args []string) error {
	if len(args) != 2 {
		return errors.New("compare a.bin b.bin")
	}
	a, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	b, err := os.ReadFile(args[1])
	if err != nil {
		return err
	}
	// Prints the length of the common prefix, the lengths, and the first
	// difference (exit 0 either way: the caller records the result).
	n := min(len(a), len(b)) / 4
	same, diff := n, ""
	for i := range n {
		if x, y := binary.LittleEndian.Uint32(a[4*i:]), binary.LittleEndian.Uint32(b[4*i:]); x != y {
			same, diff = i, fmt.Sprintf("id %d: %d in %s, %d in %s", i, x, args[0], y, args[1])
			break
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"identical_ids": same, "len_a": len(a) / 4, "len_b": len(b) / 4, "first_difference": diff})
}
