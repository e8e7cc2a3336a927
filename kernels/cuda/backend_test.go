//go:build cuda

package cuda

import (
	"bytes"
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/spill-ml/spill/kernels"
)

// openCUDA opens a CUDA backend with a budget of limit bytes, closed (its
// error reported) when the test or benchmark ends.
func openCUDA(t testing.TB, limit int64) *Backend {
	t.Helper()
	b, err := Open(kernels.Config{MemoryLimit: limit})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

func TestBudget(t *testing.T) {
	b := openCUDA(t, 10<<20)
	a, err := b.Alloc(6<<20, "weights")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Alloc(5<<20, "acts")
	var oom *kernels.OOMError
	if !errors.As(err, &oom) || !errors.Is(err, kernels.ErrOutOfMemory) {
		t.Fatalf("Alloc over budget: got %v, want *OOMError", err)
	}
	if oom.Requested != 5<<20 || oom.Allocated != 6<<20 || oom.Limit != 10<<20 || oom.ByTag["weights"] != 6<<20 {
		t.Errorf("OOMError fields: %+v", oom)
	}
	c, err := b.Alloc(4<<20, "acts")
	if err != nil {
		t.Fatalf("Alloc that fits exactly: %v", err)
	}
	st := b.MemStats()
	if st.Allocated != 10<<20 || st.Peak != 10<<20 || st.Failed != 1 || st.Allocs != 2 || st.ByTag["acts"] != 4<<20 {
		t.Errorf("MemStats after allocs: %+v", st)
	}
	// Fresh memory is zeroed.
	host := bytes.Repeat([]byte{0xff}, 4<<20)
	b.CopyToHost(b.DefaultQueue(), host, kernels.View(c, 0, kernels.U8, 4<<20))
	if err := b.DefaultQueue().Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(host, make([]byte, 4<<20)) {
		t.Error("Alloc returned memory that is not zeroed")
	}
	b.Free(a)
	b.Free(c)
	st = b.MemStats()
	if st.Allocated != 0 || st.Frees != 2 || len(st.ByTag) != 0 || st.Peak != 10<<20 {
		t.Errorf("MemStats after frees: %+v", st)
	}
	b.ResetPeak()
	if st := b.MemStats(); st.Peak != 0 {
		t.Errorf("Peak after ResetPeak = %d", st.Peak)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("double Free did not panic")
			}
		}()
		b.Free(a)
	}()
}

// TestDeviceOOM asks for more than the device has under a huge budget: the
// driver's refusal must come back as an *OOMError too.
func TestDeviceOOM(t *testing.T) {
	b := openCUDA(t, 1<<50)
	_, err := b.Alloc(1<<49, "huge")
	if !errors.Is(err, kernels.ErrOutOfMemory) {
		t.Fatalf("Alloc(512 TiB) = %v, want ErrOutOfMemory", err)
	}
	if st := b.MemStats(); st.Allocated != 0 {
		t.Errorf("Allocated after refused Alloc = %d", st.Allocated)
	}
}

func TestCopies(t *testing.T) {
	b := openCUDA(t, 1<<30)
	ctx := context.Background()
	q, err := b.NewQueue("h2d")
	if err != nil {
		t.Fatal(err)
	}
	const n = 48 << 20
	buf, err := b.Alloc(n, "x")
	if err != nil {
		t.Fatal(err)
	}
	buf2, err := b.Alloc(n, "y")
	if err != nil {
		t.Fatal(err)
	}
	pin, err := b.AllocPinned(n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range pin {
		pin[i] = byte(i*7 + i>>13)
	}
	want := bytes.Clone(pin)
	x, y := kernels.View(buf, 0, kernels.U8, n), kernels.View(buf2, 0, kernels.U8, n)
	// pinned -> device -> device -> pageable, and back through pinned.
	b.CopyToDevice(q, x, pin)
	b.CopyDevice(q, y, x)
	page := make([]byte, n)
	b.CopyToHost(q, page, y)
	if err := q.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(page, want) {
		t.Fatal("pinned H2D / D2D / pageable D2H round trip differs")
	}
	clear(pin)
	page[12345] ^= 0xff
	b.CopyToDevice(q, x, page)
	b.CopyToHost(q, pin, x.Slice(0, n))
	if err := q.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pin, page) {
		t.Fatal("pageable H2D / pinned D2H round trip differs")
	}
	// Offsets: a slice in the middle of a buffer.
	part := []byte("spill")
	b.CopyToDevice(q, x.Slice(1000, 5), part)
	got := make([]byte, 7)
	b.CopyToHost(q, got, x.Slice(999, 7))
	if err := q.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	if string(got[1:6]) != "spill" || got[0] != page[999] || got[6] != page[1005] {
		t.Errorf("offset copy: got %q", got)
	}
	if err := b.FreePinned(pin); err != nil {
		t.Fatal(err)
	}
	if err := b.FreePinned(pin); err == nil {
		t.Error("second FreePinned succeeded")
	}
}

// TestEventsOrder makes one queue do a long chain of work and another copy
// its result after waiting on an event: the copy must see the final value.
func TestEventsOrder(t *testing.T) {
	b := openCUDA(t, 1<<30)
	ctx := context.Background()
	q2, err := b.NewQueue("d2h")
	if err != nil {
		t.Fatal(err)
	}
	q1 := b.DefaultQueue()
	const n = 16 << 20
	buf, err := b.Alloc(4*n, "x")
	if err != nil {
		t.Fatal(err)
	}
	x := kernels.View(buf, 0, kernels.F32, n)
	host := make([]byte, 4*n)
	for round := range 3 {
		b.Fill(q1, x, 1)
		for range 200 {
			b.Scale(q1, x, 1.0625)
		}
		b.Scale(q1, x, 0)
		b.Add(q1, x, x) // still 0
		b.Fill(q1, x, float32(round+2))
		ev, err := b.RecordEvent(q1)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.WaitEvent(q2, ev); err != nil {
			t.Fatal(err)
		}
		b.CopyToHost(q2, host, x)
		if err := q2.Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
		if !ev.Done() {
			t.Error("event not Done after the waiting queue synchronized")
		}
		if err := ev.Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
		want := math.Float32bits(float32(round + 2))
		for i := 0; i < 4*n; i += 4 * 4099 {
			if got := uint32(host[i]) | uint32(host[i+1])<<8 | uint32(host[i+2])<<16 | uint32(host[i+3])<<24; got != want {
				t.Fatalf("round %d: element %d = %#x, want %#x: the copy did not wait for the event", round, i/4, got, want)
			}
		}
	}
}

func TestSynchronizeCancel(t *testing.T) {
	b := openCUDA(t, 1<<30)
	buf, err := b.Alloc(4<<24, "x")
	if err != nil {
		t.Fatal(err)
	}
	x := kernels.View(buf, 0, kernels.F32, 1<<24)
	q := b.DefaultQueue()
	for range 2000 {
		b.Scale(q, x, 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := q.Synchronize(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Synchronize with a cancelled context = %v", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	if err := q.Synchronize(ctx2); err != nil {
		t.Fatal(err)
	}
}

func TestDeviceInfo(t *testing.T) {
	b := openCUDA(t, 0)
	info, err := b.DeviceInfo()
	if err != nil {
		t.Fatal(err)
	}
	if info.Name == "" || info.TotalMemory <= 0 || info.FreeMemory <= 0 || info.Multiprocessors <= 0 || info.Driver == "unknown" {
		t.Errorf("DeviceInfo incomplete: %+v", info)
	}
	if st := b.MemStats(); st.Limit <= 0 || st.Limit > info.TotalMemory {
		t.Errorf("default limit %d outside (0, %d]", st.Limit, info.TotalMemory)
	}
	t.Logf("%+v", info)
}
