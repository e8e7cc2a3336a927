package dataset

// Shard file layout (see FORMAT.md for the normative description):
//
//	[0, 4096)                  header: fixed fields in the first 64 bytes, zero padding after
//	[4096, indexOffset)        data: chunks, back to back, in raw order
//	[indexOffset, size-64)     index: record offsets (bytes kind only), then chunk table
//	[size-64, size)            trailer
//
// All integers are little-endian.

import (
	"encoding/binary"
	"hash/crc32"
)

const (
	// FormatVersion is the version of the shard and manifest format written by this package.
	// Readers reject any other version (see FORMAT.md, "Versioning").
	FormatVersion = 1

	headerSize     = 4096 // also the file offset of the data section; a page size
	headerUsed     = 64   // bytes of the header that carry fields
	trailerSize    = 64
	chunkEntrySize = 24

	// DefaultChunkSize is the default number of raw bytes per checksummed chunk.
	DefaultChunkSize = 1 << 20
	// DefaultShardSize is the default number of raw data bytes per shard before rolling.
	DefaultShardSize = 64 << 20
	// MaxChunkSize bounds WriterOptions.ChunkSize (and what a reader accepts).
	MaxChunkSize = 64 << 20

	chunkFlagZstd = 1 // chunk entry flag: stored bytes are one zstd frame
)

var (
	headerMagic  = [8]byte{'S', 'P', 'I', 'L', 'S', 'H', 'R', 'D'}
	trailerMagic = [8]byte{'S', 'P', 'I', 'L', 'T', 'A', 'I', 'L'}
	castagnoli   = crc32.MakeTable(crc32.Castagnoli)
)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// kind and compression codes as stored in the header.
const (
	codeTokens  = 1
	codeRecords = 2
	codeBytes   = 3

	codeNone = 0
	codeZstd = 1
)

func kindCode(k Kind) uint8 {
	switch k {
	case KindTokens:
		return codeTokens
	case KindRecords:
		return codeRecords
	case KindBytes:
		return codeBytes
	}
	return 0
}

// shardHeader is the fixed part of the first 64 bytes of a shard file.
type shardHeader struct {
	Kind        uint8  // codeTokens, codeRecords, codeBytes
	Compression uint8  // codeNone, codeZstd
	TokenSize   uint8  // 2 or 4 for tokens, else 0
	ChunkSize   uint32 // raw bytes per chunk (the last chunk may be shorter)
	SampleSize  uint32 // bytes per sample, 0 for bytes kind
	Stride      uint32 // bytes between sample starts, 0 for bytes kind
	ShardIndex  uint32 // position in the manifest's shard list
	FirstSample uint64 // global index of the shard's first sample
}

func (h *shardHeader) encode() []byte {
	b := make([]byte, headerSize)
	copy(b[0:8], headerMagic[:])
	binary.LittleEndian.PutUint32(b[8:], FormatVersion)
	binary.LittleEndian.PutUint32(b[12:], headerSize)
	b[16] = h.Kind
	b[17] = h.Compression
	b[18] = h.TokenSize
	binary.LittleEndian.PutUint32(b[20:], h.ChunkSize)
	binary.LittleEndian.PutUint32(b[24:], h.SampleSize)
	binary.LittleEndian.PutUint32(b[28:], h.Stride)
	binary.LittleEndian.PutUint32(b[32:], h.ShardIndex)
	binary.LittleEndian.PutUint64(b[40:], h.FirstSample)
	binary.LittleEndian.PutUint32(b[60:], crc32c(b[:60]))
	return b
}

// parseHeader decodes and checks the header at the start of b.
func parseHeader(b []byte) (shardHeader, error) {
	var h shardHeader
	if len(b) < headerSize {
		return h, truncatedf("file is %d bytes, shorter than the %d-byte header", len(b), headerSize)
	}
	if [8]byte(b[0:8]) != headerMagic {
		return h, formatf("bad header magic %q (not a spill shard)", b[0:8])
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != FormatVersion {
		return h, formatf("shard format version %d, this build reads version %d", v, FormatVersion)
	}
	if got, want := binary.LittleEndian.Uint32(b[60:]), crc32c(b[:60]); got != want {
		return h, formatf("header checksum %08x, computed %08x", got, want)
	}
	if off := binary.LittleEndian.Uint32(b[12:]); off != headerSize {
		return h, formatf("data offset %d, want %d", off, headerSize)
	}
	h.Kind, h.Compression, h.TokenSize = b[16], b[17], b[18]
	h.ChunkSize = binary.LittleEndian.Uint32(b[20:])
	h.SampleSize = binary.LittleEndian.Uint32(b[24:])
	h.Stride = binary.LittleEndian.Uint32(b[28:])
	h.ShardIndex = binary.LittleEndian.Uint32(b[32:])
	h.FirstSample = binary.LittleEndian.Uint64(b[40:])
	if h.Compression != codeNone && h.Compression != codeZstd {
		return h, formatf("unknown compression code %d", h.Compression)
	}
	if h.ChunkSize == 0 || h.ChunkSize > MaxChunkSize {
		return h, formatf("chunk size %d out of range (1..%d)", h.ChunkSize, MaxChunkSize)
	}
	if h.FirstSample > 1<<62 {
		return h, formatf("first sample %d out of range", h.FirstSample)
	}
	switch h.Kind {
	case codeTokens:
		ts := uint32(h.TokenSize)
		if ts != 2 && ts != 4 {
			return h, formatf("token size %d, want 2 or 4", ts)
		}
		if h.Stride == 0 || h.Stride%ts != 0 || h.SampleSize != h.Stride+ts || h.SampleSize > maxSampleSize {
			return h, formatf("token sample size %d / stride %d inconsistent", h.SampleSize, h.Stride)
		}
	case codeRecords:
		if h.TokenSize != 0 || h.SampleSize < 8 || h.SampleSize%4 != 0 || h.Stride != h.SampleSize || h.SampleSize > maxSampleSize {
			return h, formatf("record sample size %d / stride %d inconsistent", h.SampleSize, h.Stride)
		}
	case codeBytes:
		if h.TokenSize != 0 || h.SampleSize != 0 || h.Stride != 0 {
			return h, formatf("bytes shard with sample size %d / stride %d", h.SampleSize, h.Stride)
		}
	default:
		return h, formatf("unknown kind code %d", h.Kind)
	}
	return h, nil
}

// shardTrailer is the last 64 bytes of a shard file.
type shardTrailer struct {
	Chunks      uint32
	Samples     uint64
	RawBytes    uint64 // total raw (uncompressed) data bytes
	IndexOffset uint64 // file offset of the index (= headerSize + stored data bytes)
	IndexCRC    uint32 // crc32c of [IndexOffset, size-64)
}

func (t *shardTrailer) encode() []byte {
	b := make([]byte, trailerSize)
	copy(b[0:8], trailerMagic[:])
	binary.LittleEndian.PutUint32(b[8:], FormatVersion)
	binary.LittleEndian.PutUint32(b[12:], t.Chunks)
	binary.LittleEndian.PutUint64(b[16:], t.Samples)
	binary.LittleEndian.PutUint64(b[24:], t.RawBytes)
	binary.LittleEndian.PutUint64(b[32:], t.IndexOffset)
	binary.LittleEndian.PutUint32(b[56:], t.IndexCRC)
	binary.LittleEndian.PutUint32(b[60:], crc32c(b[:60]))
	return b
}

// parseTrailer decodes and checks the trailer at the end of b (the whole file).
func parseTrailer(b []byte) (shardTrailer, error) {
	var t shardTrailer
	if len(b) < headerSize+trailerSize {
		return t, truncatedf("file is %d bytes, shorter than header and trailer (%d)", len(b), headerSize+trailerSize)
	}
	tb := b[len(b)-trailerSize:]
	if [8]byte(tb[0:8]) != trailerMagic {
		return t, truncatedf("no trailer magic at end of file (file cut short or not finished)")
	}
	if v := binary.LittleEndian.Uint32(tb[8:]); v != FormatVersion {
		return t, formatf("trailer format version %d, this build reads version %d", v, FormatVersion)
	}
	if got, want := binary.LittleEndian.Uint32(tb[60:]), crc32c(tb[:60]); got != want {
		return t, formatf("trailer checksum %08x, computed %08x", got, want)
	}
	t.Chunks = binary.LittleEndian.Uint32(tb[12:])
	t.Samples = binary.LittleEndian.Uint64(tb[16:])
	t.RawBytes = binary.LittleEndian.Uint64(tb[24:])
	t.IndexOffset = binary.LittleEndian.Uint64(tb[32:])
	t.IndexCRC = binary.LittleEndian.Uint32(tb[56:])
	return t, nil
}

// chunkEntry is one row of the chunk table.
type chunkEntry struct {
	Offset    uint64 // file offset of the stored bytes
	StoredLen uint32
	RawLen    uint32
	CRC       uint32 // crc32c of the stored bytes
	Flags     uint32 // chunkFlagZstd
}

func (c *chunkEntry) put(b []byte) {
	binary.LittleEndian.PutUint64(b[0:], c.Offset)
	binary.LittleEndian.PutUint32(b[8:], c.StoredLen)
	binary.LittleEndian.PutUint32(b[12:], c.RawLen)
	binary.LittleEndian.PutUint32(b[16:], c.CRC)
	binary.LittleEndian.PutUint32(b[20:], c.Flags)
}

func getChunkEntry(b []byte) chunkEntry {
	return chunkEntry{
		Offset:    binary.LittleEndian.Uint64(b[0:]),
		StoredLen: binary.LittleEndian.Uint32(b[8:]),
		RawLen:    binary.LittleEndian.Uint32(b[12:]),
		CRC:       binary.LittleEndian.Uint32(b[16:]),
		Flags:     binary.LittleEndian.Uint32(b[20:]),
	}
}

// shardLayout is a parsed and checked shard file. offsets aliases the file bytes.
type shardLayout struct {
	hdr     shardHeader
	trl     shardTrailer
	chunks  []chunkEntry
	offsets []byte // bytes kind: (Samples+1) little-endian uint64 raw offsets; else nil
}

// recordBounds returns the raw byte range of local record j of a bytes shard.
func (l *shardLayout) recordBounds(j int64) (int64, int64) {
	a := binary.LittleEndian.Uint64(l.offsets[8*j:])
	b := binary.LittleEndian.Uint64(l.offsets[8*j+8:])
	return int64(a), int64(b)
}

// parseShard checks a whole shard file image: header, trailer, index checksum, the chunk
// table (contiguous, sizes consistent with the chunk size) and the sample geometry. It
// reads no chunk data. Errors wrap ErrFormat or ErrTruncated; they carry no file name.
func parseShard(b []byte) (*shardLayout, error) {
	h, err := parseHeader(b)
	if err != nil {
		return nil, err
	}
	t, err := parseTrailer(b)
	if err != nil {
		return nil, err
	}
	size := uint64(len(b))
	indexEnd := size - trailerSize
	if t.IndexOffset < headerSize || t.IndexOffset > indexEnd {
		return nil, truncatedf("index offset %d outside [%d, %d] (file size %d)", t.IndexOffset, headerSize, indexEnd, size)
	}
	index := b[t.IndexOffset:indexEnd]
	if got := crc32c(index); got != t.IndexCRC {
		return nil, formatf("index checksum %08x, computed %08x", t.IndexCRC, got)
	}
	if t.RawBytes > 1<<62 || t.Samples > 1<<62 {
		return nil, formatf("raw size %d / samples %d out of range", t.RawBytes, t.Samples)
	}
	var offLen uint64
	if h.Kind == codeBytes {
		if t.Samples >= uint64(len(index))/8 {
			return nil, formatf("%d records do not fit a %d-byte index", t.Samples, len(index))
		}
		offLen = 8 * (t.Samples + 1)
	}
	cs := uint64(h.ChunkSize)
	wantChunks := (t.RawBytes + cs - 1) / cs
	if uint64(t.Chunks) != wantChunks {
		return nil, formatf("%d chunks for %d raw bytes of chunk size %d, want %d", t.Chunks, t.RawBytes, cs, wantChunks)
	}
	if want := offLen + uint64(t.Chunks)*chunkEntrySize; uint64(len(index)) != want {
		return nil, formatf("index is %d bytes, want %d", len(index), want)
	}
	l := &shardLayout{hdr: h, trl: t, chunks: make([]chunkEntry, t.Chunks)}
	if offLen > 0 {
		l.offsets = index[:offLen:offLen]
	}
	pos := uint64(headerSize)
	for i := range l.chunks {
		c := getChunkEntry(index[offLen+uint64(i)*chunkEntrySize:])
		wantRaw := min(cs, t.RawBytes-uint64(i)*cs)
		switch {
		case c.Offset != pos:
			return nil, formatf("chunk %d at offset %d, want %d", i, c.Offset, pos)
		case uint64(c.RawLen) != wantRaw:
			return nil, formatf("chunk %d raw length %d, want %d", i, c.RawLen, wantRaw)
		case c.Flags&^chunkFlagZstd != 0:
			return nil, formatf("chunk %d has unknown flags %#x", i, c.Flags)
		case c.Flags&chunkFlagZstd == 0 && c.StoredLen != c.RawLen:
			return nil, formatf("raw chunk %d stores %d bytes for %d", i, c.StoredLen, c.RawLen)
		case c.Flags&chunkFlagZstd != 0 && (h.Compression != codeZstd || c.StoredLen == 0):
			return nil, formatf("chunk %d: bad zstd chunk in a shard of compression code %d", i, h.Compression)
		}
		pos += uint64(c.StoredLen)
		if pos > t.IndexOffset {
			return nil, formatf("chunk %d ends at %d, past the index at %d", i, pos, t.IndexOffset)
		}
		l.chunks[i] = c
	}
	if pos != t.IndexOffset {
		return nil, formatf("chunks end at %d, index starts at %d", pos, t.IndexOffset)
	}
	switch h.Kind {
	case codeTokens:
		ts := uint64(h.TokenSize)
		if t.RawBytes%ts != 0 {
			return nil, formatf("%d raw bytes is not a whole number of %d-byte tokens", t.RawBytes, ts)
		}
		if t.Samples > 0 && (t.Samples-1)*uint64(h.Stride)+uint64(h.SampleSize) > t.RawBytes {
			return nil, formatf("%d token windows need more than the %d raw bytes stored", t.Samples, t.RawBytes)
		}
	case codeRecords:
		if t.Samples*uint64(h.SampleSize) != t.RawBytes {
			return nil, formatf("%d records of %d bytes, but %d raw bytes", t.Samples, h.SampleSize, t.RawBytes)
		}
	case codeBytes:
		prev := uint64(0)
		for j := uint64(0); j <= t.Samples; j++ {
			o := binary.LittleEndian.Uint64(l.offsets[8*j:])
			if o < prev || (j == 0 && o != 0) {
				return nil, formatf("record offset %d (%d) out of order", j, o)
			}
			prev = o
		}
		if prev != t.RawBytes {
			return nil, formatf("record offsets end at %d, raw data is %d bytes", prev, t.RawBytes)
		}
	}
	return l, nil
}

func crc32Update(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

func putUint64(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }
