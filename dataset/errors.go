package dataset

import (
	"errors"
	"fmt"
)

// Sentinel errors. They are wrapped by *ShardError and by the errors of Open, so callers
// test for them with errors.Is.
var (
	// ErrChecksum reports stored bytes whose crc32c does not match the recorded one.
	ErrChecksum = errors.New("dataset: checksum mismatch")
	// ErrFormat reports a file that is not a valid spill dataset file (bad magic, unknown
	// version, inconsistent fields, manifest that disagrees with a shard).
	ErrFormat = errors.New("dataset: bad format")
	// ErrTruncated reports a file shorter than its header, footer or manifest entry says.
	ErrTruncated = errors.New("dataset: truncated file")
)

// ShardError is returned for a problem located in one shard file: a corrupted chunk, a bad
// header or footer, a size that disagrees with the manifest.
type ShardError struct {
	Shard  string // path of the shard file
	Chunk  int    // chunk index within the shard, or -1 when the problem is not in a chunk
	Offset int64  // byte offset in the shard file where the bad region starts, or -1
	Err    error  // wraps one of ErrChecksum, ErrFormat, ErrTruncated or an I/O error
}

func (e *ShardError) Error() string {
	where := e.Shard
	if e.Chunk >= 0 {
		where = fmt.Sprintf("%s chunk %d", where, e.Chunk)
	}
	if e.Offset >= 0 {
		where = fmt.Sprintf("%s (offset %d)", where, e.Offset)
	}
	return fmt.Sprintf("dataset: shard %s: %v", where, e.Err)
}

// Unwrap returns the underlying error.
func (e *ShardError) Unwrap() error { return e.Err }

func shardErr(path string, chunk int, off int64, err error) *ShardError {
	return &ShardError{Shard: path, Chunk: chunk, Offset: off, Err: err}
}

// formatf returns an error wrapping ErrFormat with a description.
func formatf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(format, args...))
}

// truncatedf returns an error wrapping ErrTruncated with a description.
func truncatedf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrTruncated, fmt.Sprintf(format, args...))
}
