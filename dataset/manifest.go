package dataset

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ManifestName is the file name of the manifest inside a dataset directory.
const ManifestName = "manifest.json"

// manifestFormat is the value of Manifest.Format: it marks a file as a spill manifest.
const manifestFormat = "spill-dataset"

// Compression names the per-chunk compression of a dataset.
type Compression string

const (
	CompressionNone Compression = "none"
	CompressionZstd Compression = "zstd"
)

// Manifest is the content of manifest.json: everything needed to interpret the shards.
type Manifest struct {
	Format        string      `json:"format"`         // always "spill-dataset"
	FormatVersion int         `json:"format_version"` // FormatVersion
	Schema        Schema      `json:"schema"`
	Samples       int64       `json:"samples"`          // total samples over all shards
	Tokens        int64       `json:"tokens,omitempty"` // tokens kind: distinct tokens stored (boundary repeats not counted)
	Compression   Compression `json:"compression"`
	ChunkSize     int         `json:"chunk_size"` // raw bytes per chunk (last chunk of a shard may be shorter)
	ShardSize     int64       `json:"shard_size"` // raw bytes per shard the writer aimed for
	Created       string      `json:"created"`    // RFC 3339 UTC time of Commit
	RawBytes      int64       `json:"raw_bytes"`  // sum of Shards[].RawBytes
	StoredBytes   int64       `json:"stored_bytes"`
	Shards        []ShardInfo `json:"shards"`
}

// ShardInfo describes one shard file in the manifest.
type ShardInfo struct {
	Name        string `json:"name"`         // file name inside the dataset directory
	Size        int64  `json:"size"`         // file size in bytes
	FirstSample int64  `json:"first_sample"` // global index of the first sample
	Samples     int64  `json:"samples"`
	Chunks      int    `json:"chunks"`
	RawBytes    int64  `json:"raw_bytes"`    // uncompressed data bytes
	StoredBytes int64  `json:"stored_bytes"` // data bytes as stored (excludes header and index)
	CRC32C      uint32 `json:"crc32c"`       // crc32c (Castagnoli) of the whole file
}

// ParseManifest decodes and checks manifest JSON. name is used in error messages.
// Unknown fields are ignored (additive changes keep the format version).
func ParseManifest(name string, data []byte) (*Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&m); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line := 1 + bytes.Count(data[:min(int(se.Offset), len(data))], []byte("\n"))
			return nil, fmt.Errorf("dataset: %s:%d: %w", name, line, formatWrap("bad manifest JSON", err))
		}
		return nil, fmt.Errorf("dataset: %s: %w", name, formatWrap("bad manifest JSON", err))
	}
	if dec.More() {
		return nil, fmt.Errorf("dataset: %s: %w", name, formatf("trailing data after the manifest object"))
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("dataset: %s: %w", name, err)
	}
	return &m, nil
}

// validate checks the manifest's internal consistency (not the shard files).
func (m *Manifest) validate() error {
	if m.Format != manifestFormat {
		return formatf("format %q, want %q", m.Format, manifestFormat)
	}
	if m.FormatVersion != FormatVersion {
		return formatf("format_version %d, this build reads version %d", m.FormatVersion, FormatVersion)
	}
	if err := m.Schema.Validate(); err != nil {
		return formatWrap("", err)
	}
	if m.Compression != CompressionNone && m.Compression != CompressionZstd {
		return formatf("compression %q, want none or zstd", m.Compression)
	}
	if m.ChunkSize <= 0 || m.ChunkSize > MaxChunkSize {
		return formatf("chunk_size %d out of range (1..%d)", m.ChunkSize, MaxChunkSize)
	}
	if m.Samples < 0 || m.Tokens < 0 {
		return formatf("negative samples %d or tokens %d", m.Samples, m.Tokens)
	}
	seen := make(map[string]bool, len(m.Shards))
	var next, raw, stored int64
	for i, s := range m.Shards {
		switch {
		case s.Name == "" || s.Name != filepath.Base(s.Name) || strings.ContainsAny(s.Name, `/\`) || s.Name == "." || s.Name == ".." || s.Name == ManifestName:
			return formatf("shard %d: bad file name %q", i, s.Name)
		case seen[s.Name]:
			return formatf("shard %d: duplicate file name %q", i, s.Name)
		case s.FirstSample != next:
			return formatf("shard %d (%s): first_sample %d, want %d", i, s.Name, s.FirstSample, next)
		case s.Samples < 0 || s.Samples > 1<<62 || s.Chunks < 0 || s.RawBytes < 0 || s.StoredBytes < 0:
			return formatf("shard %d (%s): negative or huge counts", i, s.Name)
		case s.Size < headerSize+trailerSize || s.StoredBytes > s.Size:
			return formatf("shard %d (%s): size %d too small for %d stored bytes", i, s.Name, s.Size, s.StoredBytes)
		}
		seen[s.Name] = true
		next += s.Samples
		raw += s.RawBytes
		stored += s.StoredBytes
		if next > 1<<62 || raw > 1<<62 || stored > 1<<62 {
			return formatf("shard %d (%s): totals overflow", i, s.Name)
		}
	}
	if next != m.Samples {
		return formatf("shards hold %d samples, manifest says %d", next, m.Samples)
	}
	if raw != m.RawBytes || stored != m.StoredBytes {
		return formatf("shards hold %d raw / %d stored bytes, manifest says %d / %d", raw, stored, m.RawBytes, m.StoredBytes)
	}
	return nil
}

// ReadManifest reads and checks dir/manifest.json.
func ReadManifest(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestName)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	return ParseManifest(path, data)
}

func marshalManifest(m *Manifest) ([]byte, error) {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("dataset: encode manifest: %w", err)
	}
	return append(data, '\n'), nil
}
