package offload

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"
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
	// Workers bounds the reads and writes in flight. Default 4.
	Workers int
}

// Disk keeps tensors (optimizer state, master weights) in memory-mapped
// files, one per Key, and reads and writes them with a bounded set of
// asynchronous workers. Space is reserved when a file is created
// (fallocate on Linux), so a full disk is an error from Create, never a
// crash while writing through the mapping.
//
// All methods are safe for concurrent use. Concurrent Store and Load of
// the same key are not ordered with each other: the caller orders them
// (the residency Table's transitions do).
type Disk struct {
	cfg    DiskConfig
	budget *semaphore.Weighted
	g      errgroup.Group
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
	m    []byte // the mapping, or nil where files are not mapped
}

// OpenDisk prepares the directory and returns the tier.
func OpenDisk(cfg DiskConfig) (*Disk, error) {
	if cfg.Dir == "" || cfg.Budget <= 0 {
		return nil, fmt.Errorf("offload: disk tier needs a directory and a positive budget (dir %q, budget %d)", cfg.Dir, cfg.Budget)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("offload: disk tier: %w%s", err, diskHint(err))
	}
	d := &Disk{cfg: cfg, budget: semaphore.NewWeighted(cfg.Budget), allocate: allocateFile}
	d.open = func(name string) (*os.File, error) {
		return os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	}
	d.g.SetLimit(cfg.Workers)
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
	if err := df.mapFile(); err != nil {
		df.close(true)
		return nil, fmt.Errorf("offload: disk tier: mapping %s: %w", p, err)
	}
	return df, nil
}

func (df *diskFile) close(remove bool) error {
	err := df.unmap()
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

func failed(err error) *Op {
	o := &Op{done: make(chan struct{}), err: err}
	close(o.done)
	return o
}

// submit runs fn on a worker. It blocks while all workers are busy
// (backpressure) or until ctx is done.
func (d *Disk) submit(ctx context.Context, fn func() error) *Op {
	if err := ctx.Err(); err != nil {
		return failed(err)
	}
	o := &Op{done: make(chan struct{})}
	d.g.Go(func() error {
		defer close(o.done)
		if err := ctx.Err(); err != nil {
			o.err = err
			return nil
		}
		o.err = fn()
		return nil // errors belong to the Op, not to the tier
	})
	return o
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
	return d.submit(ctx, func() error {
		if err := df.writeAll(src); err != nil {
			return fmt.Errorf("offload: disk tier: writing %s: %w%s", df.path, err, diskHint(err))
		}
		return nil
	})
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
	return d.submit(ctx, func() error {
		if err := df.readAll(dst); err != nil {
			return fmt.Errorf("offload: disk tier: reading %s: %w", df.path, err)
		}
		return nil
	})
}

// Map returns the file's mapping for direct access (a host optimizer that
// updates master weights in place), or nil where files are not mapped. The
// slice stops being valid at Remove or Close.
func (d *Disk) Map(k Key) ([]byte, error) {
	df, err := d.file(k)
	if err != nil {
		return nil, err
	}
	return df.m, nil
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
	d.g.Wait()
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
