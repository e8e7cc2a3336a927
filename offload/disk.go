package offload

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sync/semaphore"

	"github.com/spill-ml/spill/kernels"
)

// DiskConfig configures a Disk tier.
type DiskConfig struct {
	// Dir is a directory on local disk; it is created if missing. Files
	// in it are scratch space: Close removes them.
	Dir string
	// Budget is the most bytes the tier's files may take. Required.
	Budget int64
	// Workers bounds the requests in flight (the drive's queue depth the
	// tier uses). Default 4.
	Workers int
	// Chunk is the size of one request: a Store or Load is split into
	// requests of Chunk bytes (rounded up to DiskAlign) that the workers
	// run in parallel. Default 8 MiB.
	Chunk int64
}

// DiskAlign is the alignment of direct (O_DIRECT) requests: offsets,
// lengths and buffer addresses that are multiples of it bypass the page
// cache (AlignedBytes gives such buffers).
const DiskAlign = 4096

// AlignedBytes returns n bytes of Go memory whose first byte is aligned
// to DiskAlign, so that the disk tier reads and writes them directly.
func AlignedBytes(n int64) []byte {
	b := NewF32Bytes(n + DiskAlign)
	off := int64(0)
	if r := int64(uintptr(unsafe.Pointer(unsafe.SliceData(b))) % DiskAlign); r != 0 {
		off = DiskAlign - r
	}
	return b[off : off+n : off+n]
}

// Disk keeps tensors (optimizer state) in files, one per Key, and reads
// and writes them with a bounded set of asynchronous workers, in large
// requests: each Store or Load is split into Chunk-sized requests that run
// in parallel. Where the file system allows it, requests whose offset,
// length and buffer are aligned to DiskAlign go around the page cache
// (O_DIRECT), at the drive's speed and without growing the page cache by
// the tier's size; the rest (an unaligned tail, a file system without
// direct I/O such as tmpfs) use ordinary reads and writes. Space is
// reserved when a file is created (fallocate on Linux), so a full disk is
// an error from Create rather than from a write in the middle of a run.
//
// All methods are safe for concurrent use. Concurrent Store and Load of
// the same key are not ordered with each other: the caller orders them
// (the residency Table's transitions do).
type Disk struct {
	cfg    DiskConfig
	budget *semaphore.Weighted
	// workers bounds the requests in flight; ops counts the Stores and
	// Loads not finished (Close waits for them).
	workers *semaphore.Weighted
	ops     sync.WaitGroup
	// hooks for tests
	open     func(name string) (*os.File, error)
	allocate func(f *os.File, n int64) error

	mu struct {
		sync.Mutex
		files  map[Key]*diskFile
		used   int64
		closed bool
	}
}

type diskFile struct {
	path string
	size int64
	f    *os.File
	// direct is the file opened for direct I/O, or nil where the file
	// system does not support it (or a direct request failed with EINVAL).
	direct atomic.Pointer[os.File]
}

// OpenDisk prepares the directory and returns the tier.
func OpenDisk(cfg DiskConfig) (*Disk, error) {
	if cfg.Dir == "" || cfg.Budget <= 0 {
		return nil, fmt.Errorf("offload: disk tier needs a directory and a positive budget (dir %q, budget %d)", cfg.Dir, cfg.Budget)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Chunk <= 0 {
		cfg.Chunk = 8 << 20
	}
	cfg.Chunk = (cfg.Chunk + DiskAlign - 1) &^ (DiskAlign - 1)
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("offload: disk tier: %w%s", err, diskHint(err))
	}
	d := &Disk{cfg: cfg, budget: semaphore.NewWeighted(cfg.Budget), workers: semaphore.NewWeighted(int64(cfg.Workers)),
		allocate: allocateFile}
	d.open = func(name string) (*os.File, error) {
		return os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	}
	d.mu.files = map[Key]*diskFile{}
	return d, nil
}

// diskHint explains the common causes of a failed file operation.
func diskHint(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return " (disk full: free space, or lower the disk budget)"
	case errors.Is(err, syscall.EROFS), errors.Is(err, os.ErrPermission):
		return " (not writable: choose a writable directory with --disk-dir)"
	case errors.Is(err, syscall.EDQUOT):
		return " (disk quota exceeded)"
	}
	return ""
}

func (d *Disk) path(k Key) string { return filepath.Join(d.cfg.Dir, k.FileName()) }

// Create makes the file for k, n bytes of zeros, reserving them from the
// budget. It fails with a *BudgetError if the budget is exhausted and with
// an error naming the file if the disk refuses.
func (d *Disk) Create(k Key, n int64) error {
	if n <= 0 {
		return fmt.Errorf("offload: disk file for %s of %d bytes", k, n)
	}
	if !d.budget.TryAcquire(n) {
		d.mu.Lock()
		defer d.mu.Unlock()
		e := &BudgetError{Tier: TierDisk, Class: k.Class, Requested: n, Limit: d.cfg.Budget,
			Reserved: d.mu.used, Allocated: d.mu.used, ByClass: map[Class]int64{}}
		for fk, f := range d.mu.files {
			e.ByClass[fk.Class] += f.size
		}
		return e
	}
	df, err := d.createFile(k, n)
	if err != nil {
		d.budget.Release(n)
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, dup := d.mu.files[k]; dup || d.mu.closed {
		df.close(true)
		d.budget.Release(n)
		if d.mu.closed {
			return fmt.Errorf("offload: disk tier is closed")
		}
		return fmt.Errorf("offload: disk file for %s exists", k)
	}
	d.mu.files[k] = df
	d.mu.used += n
	return nil
}

func (d *Disk) createFile(k Key, n int64) (*diskFile, error) {
	p := d.path(k)
	f, err := d.open(p)
	if err != nil {
		return nil, fmt.Errorf("offload: disk tier: creating %s: %w%s", p, err, diskHint(err))
	}
	df := &diskFile{path: p, size: n, f: f}
	if err := d.allocate(f, n); err != nil {
		df.close(true)
		return nil, fmt.Errorf("offload: disk tier: reserving %s for %s: %w%s", kernels.FormatBytes(n), p, err, diskHint(err))
	}
	if f, err := openDirect(p); err == nil {
		df.direct.Store(f)
	}
	return df, nil
}

func (df *diskFile) close(remove bool) error {
	var err error
	if f := df.direct.Swap(nil); f != nil {
		err = f.Close()
	}
	if cerr := df.f.Close(); err == nil {
		err = cerr
	}
	if remove {
		if rerr := os.Remove(df.path); err == nil && !errors.Is(rerr, os.ErrNotExist) {
			err = rerr
		}
	}
	return err
}

func (d *Disk) file(k Key) (*diskFile, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.closed {
		return nil, fmt.Errorf("offload: disk tier is closed")
	}
	df, ok := d.mu.files[k]
	if !ok {
		return nil, fmt.Errorf("offload: no disk file for %s", k)
	}
	return df, nil
}

// Op is an asynchronous read or write.
type Op struct {
	done chan struct{}
	err  error
}

// Wait blocks until the operation has finished and returns its error, or
// ctx.Err() if ctx is done first (the operation still completes).
func (o *Op) Wait(ctx context.Context) error {
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done reports without blocking whether the operation has finished.
func (o *Op) Done() bool {
	select {
	case <-o.done:
		return true
	default:
		return false
	}
}

// FailedOp is an Op that has finished with err: for a caller that fails
// a request before it reaches the tier.
func FailedOp(err error) *Op { return failed(err) }

func failed(err error) *Op {
	o := &Op{done: make(chan struct{}), err: err}
	close(o.done)
	return o
}

// io runs a write or read of buf at offset base of df (a Store or Load:
// the whole file) as requests of at most Chunk bytes on the workers, and
// returns at once.
func (d *Disk) io(ctx context.Context, df *diskFile, buf []byte, base int64, write bool) *Op {
	if err := ctx.Err(); err != nil {
		return failed(err)
	}
	o := &Op{done: make(chan struct{})}
	d.ops.Add(1)
	go func() {
		defer d.ops.Done()
		defer close(o.done)
		var wg sync.WaitGroup
		var mu sync.Mutex
		setErr := func(err error) {
			mu.Lock()
			if o.err == nil {
				o.err = err
			}
			mu.Unlock()
		}
		size := int64(len(buf))
		for off := int64(0); off < size; off += d.cfg.Chunk {
			if err := d.workers.Acquire(ctx, 1); err != nil {
				setErr(err)
				break
			}
			end := min(off+d.cfg.Chunk, size)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer d.workers.Release(1)
				if err := ctx.Err(); err != nil {
					setErr(err)
					return
				}
				if err := df.request(buf[off:end], base+off, write); err != nil {
					op := "reading"
					if write {
						op = "writing"
					}
					setErr(fmt.Errorf("offload: disk tier: %s %s: %w%s", op, df.path, err, diskHint(err)))
				}
			}()
		}
		wg.Wait()
	}()
	return o
}

// request reads or writes b at offset off: the aligned part directly
// when the file allows it, the rest through the page cache.
func (df *diskFile) request(b []byte, off int64, write bool) error {
	n := int64(len(b)) &^ (DiskAlign - 1)
	if f := df.direct.Load(); f != nil && n > 0 && off%DiskAlign == 0 &&
		uintptr(unsafe.Pointer(unsafe.SliceData(b)))%DiskAlign == 0 {
		err := rw(f, b[:n], off, write)
		if errors.Is(err, syscall.EINVAL) {
			// The file system refuses direct I/O after all: go through
			// the page cache from now on.
			df.direct.CompareAndSwap(f, nil)
			n = 0
		} else if err != nil {
			return err
		}
		b, off = b[n:], off+n
	}
	if len(b) == 0 {
		return nil
	}
	return rw(df.f, b, off, write)
}

func rw(f *os.File, b []byte, off int64, write bool) error {
	var err error
	if write {
		_, err = f.WriteAt(b, off)
	} else {
		_, err = f.ReadAt(b, off)
	}
	return err
}

// Store writes src (exactly the file's size) into k's file asynchronously.
// src must stay unchanged until the Op is done.
func (d *Disk) Store(ctx context.Context, k Key, src []byte) *Op {
	df, err := d.file(k)
	if err != nil {
		return failed(err)
	}
	if int64(len(src)) != df.size {
		return failed(fmt.Errorf("offload: storing %d bytes into %s of %d", len(src), df.path, df.size))
	}
	return d.io(ctx, df, src, 0, true)
}

// Load reads k's file into dst (exactly the file's size) asynchronously.
// dst must not be touched until the Op is done.
func (d *Disk) Load(ctx context.Context, k Key, dst []byte) *Op {
	df, err := d.file(k)
	if err != nil {
		return failed(err)
	}
	if int64(len(dst)) != df.size {
		return failed(fmt.Errorf("offload: loading %s of %d bytes into %d", df.path, df.size, len(dst)))
	}
	return d.io(ctx, df, dst, 0, false)
}

// ReadAt reads len(dst) bytes of k's file at offset off into dst and
// waits for them: a part of a tensor (a checkpoint streams the tensors
// of a layer's file one by one). The requests are Load's.
func (d *Disk) ReadAt(ctx context.Context, k Key, dst []byte, off int64) error {
	return d.rangeIO(ctx, k, dst, off, false)
}

// WriteAt writes src into k's file at offset off and waits for it.
func (d *Disk) WriteAt(ctx context.Context, k Key, src []byte, off int64) error {
	return d.rangeIO(ctx, k, src, off, true)
}

func (d *Disk) rangeIO(ctx context.Context, k Key, b []byte, off int64, write bool) error {
	df, err := d.file(k)
	if err != nil {
		return err
	}
	if off < 0 || off+int64(len(b)) > df.size {
		return fmt.Errorf("offload: bytes [%d, %d) outside %s of %d", off, off+int64(len(b)), df.path, df.size)
	}
	if len(b) == 0 {
		return nil
	}
	return d.io(ctx, df, b, off, write).Wait(ctx)
}

// Remove deletes k's file and returns its bytes to the budget. The caller
// must have waited for its operations.
func (d *Disk) Remove(k Key) error {
	d.mu.Lock()
	df, ok := d.mu.files[k]
	if ok {
		delete(d.mu.files, k)
		d.mu.used -= df.size
	}
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("offload: no disk file for %s", k)
	}
	err := df.close(true)
	d.budget.Release(df.size)
	return err
}

// Used is the bytes of the tier's files.
func (d *Disk) Used() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.used
}

// Close waits for operations in flight and removes every file.
func (d *Disk) Close() error {
	d.ops.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mu.closed = true
	var first error
	for k, df := range d.mu.files {
		if err := df.close(true); err != nil && first == nil {
			first = err
		}
		delete(d.mu.files, k)
	}
	d.mu.used = 0
	return first
}

// DiskRates are the disk tier's measured throughputs.
type DiskRates struct {
	Read, Write float64 // bytes per second
	// Direct says the requests went around the page cache (O_DIRECT);
	// otherwise the rates are the page cache's and overstate the drive.
	Direct bool
}

// MeasureDisk writes and reads back n bytes in a file under dir with the
// disk tier's own requests (the default chunk and workers) and returns
// the rates; the write is timed until the data is on the drive (fsync).
// It removes what it wrote.
func MeasureDisk(ctx context.Context, dir string, n int64) (DiskRates, error) {
	sub, err := os.MkdirTemp(dir, "spill-disk-test-")
	if err != nil && os.MkdirAll(dir, 0o755) == nil {
		sub, err = os.MkdirTemp(dir, "spill-disk-test-")
	}
	if err != nil {
		return DiskRates{}, fmt.Errorf("offload: disk test: %w%s", err, diskHint(err))
	}
	defer os.RemoveAll(sub)
	d, err := OpenDisk(DiskConfig{Dir: sub, Budget: n})
	if err != nil {
		return DiskRates{}, err
	}
	defer d.Close()
	k := Key{Layer: 0, Class: AdamM}
	if err := d.Create(k, n); err != nil {
		return DiskRates{}, err
	}
	b := AlignedBytes(n)
	for i := range b {
		b[i] = byte(i * 131)
	}
	df, err := d.file(k)
	if err != nil {
		return DiskRates{}, err
	}
	start := time.Now()
	if err := d.Store(ctx, k, b).Wait(ctx); err != nil {
		return DiskRates{}, err
	}
	if err := df.f.Sync(); err != nil {
		return DiskRates{}, fmt.Errorf("offload: disk test: sync: %w", err)
	}
	w := time.Since(start).Seconds()
	start = time.Now()
	if err := d.Load(ctx, k, b).Wait(ctx); err != nil {
		return DiskRates{}, err
	}
	r := time.Since(start).Seconds()
	return DiskRates{Read: float64(n) / max(r, 1e-9), Write: float64(n) / max(w, 1e-9), Direct: df.direct.Load() != nil}, nil
}
