package ingest

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spill-ml/spill/dataset"
)

// binReadSize is how much of a token file is read per call.
const binReadSize = 4 << 20

// binSource reads a nanoGPT-style token file: raw little-endian uint16 tokens, no header.
type binSource struct {
	path string
	f    *os.File
	size int64
	o    *Options
}

func openBin(path string, o *Options) (source, error) {
	f, size, err := openFile(path)
	if err != nil {
		return nil, err
	}
	if size%2 != 0 {
		f.Close()
		return nil, fmt.Errorf("%s: size %d is odd; a .bin token file holds little-endian uint16 tokens", path, size)
	}
	return &binSource{path: path, f: f, size: size, o: o}, nil
}

func (s *binSource) schema() dataset.Schema {
	return dataset.Schema{Kind: dataset.KindTokens, TokenDType: "uint16"}
}

func (s *binSource) run(ctx context.Context, e *emitter) error {
	buf := make([]byte, binReadSize)
	r := countingReader{r: s.f, n: s.o.BytesRead}
	var tok int64
	for tok*2 < s.size {
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), s.size-tok*2)])
		if err != nil {
			return fmt.Errorf("%s: %w", s.path, err)
		}
		if err := e.rawTokens16(ctx, buf[:n], tok); err != nil {
			return err
		}
		tok += int64(n / 2)
	}
	return nil
}

func (s *binSource) Close() error { return s.f.Close() }
