package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// ExportCheckpoint writes the fp32 weights of the checkpoint directory
// path to out in format (FormatNanoGPT, the default for "", or FormatHF
// with o), as Export and ExportHF do with the weights LoadCheckpoint
// returns, byte for byte, but streaming: the checkpoint's files are
// checked against state.json's SHA-256 first (read through a small
// buffer), then the tensors of model.safetensors are read one at a time,
// as they are written, into one buffer of the largest tensor's size. That
// buffer and a few I/O buffers of at most 1 MiB are all the memory an
// export takes besides the headers, whatever the model's size; the
// optimizer state is only checksummed. It returns the checkpoint's state.
func ExportCheckpoint(path, out, format string, o HFExportOptions) (*TrainState, error) {
	st, names, err := checkpointFiles(path)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, safetensorsIOBuf)
	for _, name := range names {
		if err := verifyCheckpointFile(path, name, st.Files[name], buf); err != nil {
			return nil, err
		}
	}
	file := filepath.Join(path, CheckpointModelFile)
	src, err := openTensorFile(file)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", file, err)
	}
	defer src.Close()
	if format == FormatHF {
		err = ExportHF(src.tensors, st.Config, out, o)
	} else {
		err = Export(src.tensors, st.Config, out, format)
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

// verifyCheckpointFile checks the SHA-256 of the file name of the
// checkpoint directory path against want, reading it through buf; the
// error is LoadCheckpoint's.
func verifyCheckpointFile(path, name, want string, buf []byte) error {
	file := filepath.Join(path, filepath.Base(name))
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, onlyReader{f}, buf)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", file, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("checkpoint %s: checksum mismatch (file is corrupted or truncated: %d bytes, sha256 %s, state.json expects %s); %s",
			file, n, got[:12], want[:min(12, len(want))], resumeHint(path))
	}
	return nil
}

// onlyReader hides an *os.File's WriterTo, so that io.CopyBuffer uses
// the buffer it is given.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// tensorFile is a safetensors file opened for reading one tensor at a
// time: its tensors (in file order) have no Data but a Fill that reads
// them with ReadAt, safe to call from several goroutines, until Close.
type tensorFile struct {
	f       *os.File
	tensors []NamedTensor
}

// openTensorFile opens a safetensors file and parses and validates its
// header (as ReadSafetensors does) without reading the tensors.
func openTensorFile(path string) (_ *tensorFile, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	if size < 8 {
		return nil, fmt.Errorf("file is %d bytes, too short for the 8-byte header length (truncated?)", size)
	}
	var nb [8]byte
	if _, err := f.ReadAt(nb[:], 0); err != nil {
		return nil, fmt.Errorf("reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(nb[:])
	if n > maxSafetensorsHeader || int64(n) > size-8 {
		return nil, fmt.Errorf("header length %d does not fit the %d-byte file (corrupted or truncated)", n, size)
	}
	hdr := make([]byte, n)
	if _, err := f.ReadAt(hdr, 8); err != nil {
		return nil, fmt.Errorf("reading header: %w", err)
	}
	base := 8 + int64(n)
	spans, _, err := parseSafetensorsHeader(hdr, size-base)
	if err != nil {
		return nil, err
	}
	tf := &tensorFile{f: f, tensors: make([]NamedTensor, len(spans))}
	for i, s := range spans {
		s := s
		tf.tensors[i] = NamedTensor{Name: s.name, DType: s.dtype, Shape: s.shape, Fill: func(dst []byte) error {
			if int64(len(dst)) != s.end-s.begin {
				return fmt.Errorf("read into %d bytes, the tensor has %d", len(dst), s.end-s.begin)
			}
			_, err := f.ReadAt(dst, base+s.begin)
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("%s: %w (truncated?)", path, io.ErrUnexpectedEOF)
			}
			return err
		}}
	}
	return tf, nil
}

// Close closes the file; the tensors' Fill fail after it.
func (t *tensorFile) Close() error { return t.f.Close() }
