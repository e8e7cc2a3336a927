package dataset

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
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
	// ErrClosed is returned by the methods of a Dataset that read shard data after Close.
	ErrClosed = errors.New("dataset: use of closed dataset")
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
	msg := e.Err.Error()
	if pe, ok := e.Err.(*fs.PathError); ok && pe.Path == e.Shard {
		msg = pe.Op + ": " + pe.Err.Error() // the path is already in front
	}
	return fmt.Sprintf("dataset: shard %s: %s", where, msg)
}

// Unwrap returns the underlying error.
func (e *ShardError) Unwrap() error { return e.Err }

func shardErr(path string, chunk int, off int64, err error) *ShardError {
	return &ShardError{Shard: path, Chunk: chunk, Offset: off, Err: err}
}

// detailError is one of the sentinels plus a description, and optionally the error that
// caused it. It is always wrapped by an error that says "dataset: <file>: ...", so its
// message leaves out the sentinel's "dataset: " prefix: "bad format: <detail>".
type detailError struct {
	sentinel error
	detail   string
	cause    error // may be nil
}

func (e *detailError) Error() string {
	return strings.TrimPrefix(e.sentinel.Error(), "dataset: ") + ": " + e.detail
}

// Unwrap returns the sentinel and the cause, so errors.Is and errors.As see both.
func (e *detailError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.cause}
}

// formatf returns an error wrapping ErrFormat with a description.
func formatf(format string, args ...any) error {
	return &detailError{sentinel: ErrFormat, detail: fmt.Sprintf(format, args...)}
}

// truncatedf returns an error wrapping ErrTruncated with a description.
func truncatedf(format string, args ...any) error {
	return &detailError{sentinel: ErrTruncated, detail: fmt.Sprintf(format, args...)}
}

// checksumf returns an error wrapping ErrChecksum with a description.
func checksumf(format string, args ...any) error {
	return &detailError{sentinel: ErrChecksum, detail: fmt.Sprintf(format, args...)}
}

// formatWrap returns an error wrapping ErrFormat and cause, described as what (if not
// empty) and cause's message (without its "dataset: " prefix, lines joined with "; ").
func formatWrap(what string, cause error) error {
	msg := strings.ReplaceAll(strings.TrimPrefix(cause.Error(), "dataset: "), "\n", "; ")
	if what != "" {
		msg = what + ": " + msg
	}
	return &detailError{sentinel: ErrFormat, detail: msg, cause: cause}
}
