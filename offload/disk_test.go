package offload

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

func TestDiskRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spill")
	d, err := OpenDisk(DiskConfig{Dir: dir, Budget: 3 * MiB, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	keys := []Key{{Layer: 1, Class: Master}, {Layer: 1, Class: AdamM}, {Layer: 2, Class: AdamV}}
	var ops []*Op
	var srcs [][]byte
	for i, k := range keys {
		if err := d.Create(k, 1*MiB); err != nil {
			t.Fatal(err)
		}
		src := bytes.Repeat([]byte{byte(i + 1), 0xA5}, int(512*KiB))
		srcs = append(srcs, src)
		ops = append(ops, d.Store(ctx, k, src))
	}
	for _, o := range ops {
		if err := o.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range keys {
		dst := make([]byte, 1*MiB)
		if err := d.Load(ctx, k, dst).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst, srcs[i]) {
			t.Fatalf("%s: read back differs", k)
		}
		if st, err := os.Stat(filepath.Join(dir, k.FileName())); err != nil || st.Size() != 1*MiB {
			t.Fatalf("%s: file %v %v", k, st, err)
		}
	}
	// Over budget: a typed error naming the class and what is held.
	err = d.Create(Key{Layer: 3, Class: Master}, 1)
	var be *BudgetError
	if !errors.As(err, &be) || be.Tier != TierDisk || !strings.Contains(err.Error(), "master 1.0 MiB") {
		t.Fatalf("over-budget Create: %v", err)
	}
	if err := d.Create(keys[0], 1); err == nil {
		t.Fatal("duplicate Create succeeded")
	}
	if err := d.Store(ctx, keys[0], make([]byte, 10)).Wait(ctx); err == nil {
		t.Fatal("short Store succeeded")
	}
	if err := d.Load(ctx, Key{Layer: 9, Class: Grads}, make([]byte, 10)).Wait(ctx); err == nil || !strings.Contains(err.Error(), "layer 9 grads") {
		t.Fatalf("Load of unknown key: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := d.Store(cctx, keys[0], srcs[0]).Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Store: %v", err)
	}
	if err := d.Remove(keys[0]); err != nil || d.Used() != 2*MiB {
		t.Fatalf("Remove: %v, used %d", err, d.Used())
	}
	if err := d.Create(Key{Layer: 3, Class: Master}, 1*MiB); err != nil {
		t.Fatalf("Create after Remove: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("Close left %d files", len(ents))
	}
}

func TestDiskReadOnlyDir(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDisk(DiskConfig{Dir: dir, Budget: 1 * MiB})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if os.Geteuid() == 0 {
		// root ignores permissions: inject the error the kernel gives others.
		d.open = func(name string) (*os.File, error) {
			return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EACCES}
		}
	} else {
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(dir, 0o755)
	}
	err = d.Create(Key{Layer: 4, Class: AdamV}, 4*KiB)
	if err == nil {
		t.Fatal("Create in a read-only directory succeeded")
	}
	want := filepath.Join(dir, "l0004-adam_v.bin")
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "not writable") {
		t.Fatalf("error %q does not name %s and the cause", err, want)
	}
	if d.Used() != 0 {
		t.Fatalf("failed Create kept %d bytes of budget", d.Used())
	}
}

func TestDiskFull(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDisk(DiskConfig{Dir: dir, Budget: 1 * MiB})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d.allocate = func(f *os.File, n int64) error { return syscall.ENOSPC }
	err = d.Create(Key{Layer: 0, Class: Master}, 64*KiB)
	if err == nil || !strings.Contains(err.Error(), "disk full") || !strings.Contains(err.Error(), "l0000-master.bin") {
		t.Fatalf("full disk: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "l0000-master.bin")); !os.IsNotExist(err) {
		t.Fatalf("failed Create left its file: %v", err)
	}
	// A directory that is a file is a clear error too.
	f := filepath.Join(dir, "plain")
	os.WriteFile(f, nil, 0o644)
	if _, err := OpenDisk(DiskConfig{Dir: filepath.Join(f, "sub"), Budget: 1}); err == nil || !strings.Contains(err.Error(), f) {
		t.Fatalf("OpenDisk under a file: %v", err)
	}
}

// TestDiskChunkedRequests: a Store or Load larger than a chunk runs as
// many requests, in parallel, aligned ones directly where the file system
// allows it, and reads back what was written whatever the buffer's
// alignment and the file's size.
func TestDiskChunkedRequests(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDisk(DiskConfig{Dir: dir, Budget: 4 * MiB, Workers: 3, Chunk: 3 * DiskAlign})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	for i, n := range []int64{100*KiB + 123, 5 * DiskAlign, 17} {
		k := Key{Layer: i, Class: AdamM}
		if err := d.Create(k, n); err != nil {
			t.Fatal(err)
		}
		for _, aligned := range []bool{true, false} {
			src := AlignedBytes(n + 1)
			if !aligned {
				src = src[1:]
			} else {
				src = src[:n]
			}
			for j := range src {
				src[j] = byte(j*7 + i + 1)
			}
			if err := d.Store(ctx, k, src).Wait(ctx); err != nil {
				t.Fatal(err)
			}
			dst := AlignedBytes(n)
			if err := d.Load(ctx, k, dst).Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst, src) {
				t.Fatalf("%d bytes, aligned buffer %v: read back differs", n, aligned)
			}
		}
		df, _ := d.file(k)
		t.Logf("%s: direct I/O %v", df.path, df.direct.Load() != nil)
	}
	if b := AlignedBytes(10); uintptr(unsafe.Pointer(&b[0]))%DiskAlign != 0 || len(b) != 10 {
		t.Fatal("AlignedBytes is not aligned")
	}
}

// TestDiskRanges: ReadAt and WriteAt move parts of a file (at unaligned
// offsets too, across chunks) and refuse ranges outside it.
func TestDiskRanges(t *testing.T) {
	d, err := OpenDisk(DiskConfig{Dir: t.TempDir(), Budget: MiB, Chunk: DiskAlign})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	k := Key{Layer: 1, Class: Master}
	const n = 5*DiskAlign + 12
	if err := d.Create(k, n); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, n)
	for _, r := range [][2]int64{{0, n}, {4, 3 * DiskAlign}, {DiskAlign, DiskAlign}, {n - 8, 8}, {17, 0}} {
		src := make([]byte, r[1])
		for j := range src {
			src[j] = byte(j*13 + int(r[0]))
		}
		if err := d.WriteAt(ctx, k, src, r[0]); err != nil {
			t.Fatal(err)
		}
		copy(want[r[0]:], src)
		got := make([]byte, n)
		if err := d.Load(ctx, k, got).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("after writing %v: the file differs", r)
		}
		part := make([]byte, r[1])
		if err := d.ReadAt(ctx, k, part, r[0]); err != nil || !bytes.Equal(part, want[r[0]:r[0]+r[1]]) {
			t.Fatalf("reading %v back: %v", r, err)
		}
	}
	if err := d.ReadAt(ctx, k, make([]byte, 16), n-8); err == nil {
		t.Error("a read past the end: no error")
	}
}

// TestMeasureDisk: the disk test writes and reads through the tier and
// leaves nothing behind.
func TestMeasureDisk(t *testing.T) {
	dir := t.TempDir()
	r, err := MeasureDisk(context.Background(), dir, 4*MiB+100)
	if err != nil {
		t.Fatal(err)
	}
	if !(r.Read > 0 && r.Write > 0) {
		t.Fatalf("rates %+v", r)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the disk test left %d entries", len(ents))
	}
	t.Logf("%+v", r)
}
