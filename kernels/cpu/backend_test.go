package cpu

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
)

func TestRegisteredAsCPU(t *testing.T) {
	be, err := kernels.Open("cpu", kernels.Config{MemoryLimit: 1 << 20, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if be.Name() != "cpu" || !strings.Contains(be.DeviceName(), "1 thread") {
		t.Fatalf("Name %q DeviceName %q", be.Name(), be.DeviceName())
	}
	if _, err := kernels.Open("cpu", kernels.Config{Device: 1}); err == nil {
		t.Fatal("Open with device 1 succeeded")
	}
}

func TestBudgetEnforced(t *testing.T) {
	const limit = 1 << 20
	be := openBE(t, limit)
	w, err := be.Alloc(600<<10, "weights")
	if err != nil {
		t.Fatal(err)
	}
	g, err := be.Alloc(300<<10, "grads")
	if err != nil {
		t.Fatal(err)
	}
	_, err = be.Alloc(200<<10, "acts")
	var oom *kernels.OOMError
	if !errors.As(err, &oom) || !errors.Is(err, kernels.ErrOutOfMemory) {
		t.Fatalf("over-budget Alloc: err = %v, want *OOMError", err)
	}
	if oom.Requested != 200<<10 || oom.Tag != "acts" || oom.Allocated != 900<<10 || oom.Limit != limit ||
		oom.ByTag["weights"] != 600<<10 || oom.ByTag["grads"] != 300<<10 {
		t.Fatalf("OOMError fields: %+v", oom)
	}
	if msg := err.Error(); !strings.Contains(msg, "grads 300.0 KiB") || !strings.Contains(msg, `"acts"`) {
		t.Fatalf("OOM message lacks the tag breakdown: %s", msg)
	}
	st := be.MemStats()
	if st.Allocated != 900<<10 || st.Peak != 900<<10 || st.Failed != 1 || st.Allocs != 2 || st.ByTag["weights"] != 600<<10 {
		t.Fatalf("MemStats %+v", st)
	}
	// Exactly filling the budget is allowed.
	a, err := be.Alloc(limit-900<<10, "acts")
	if err != nil {
		t.Fatalf("Alloc up to the limit: %v", err)
	}
	be.Free(w)
	be.Free(a)
	st = be.MemStats()
	if st.Allocated != 300<<10 || st.Peak != limit || st.Frees != 2 || len(st.ByTag) != 1 {
		t.Fatalf("after Free: %+v", st)
	}
	be.ResetPeak()
	if st := be.MemStats(); st.Peak != 300<<10 {
		t.Fatalf("ResetPeak: peak %d", st.Peak)
	}
	be.Free(g)
}

func TestBuffersZeroedAndAligned(t *testing.T) {
	be := openBE(t, 0)
	for _, n := range []int64{1, 100, 4096, mmapMin, mmapMin + 12345} {
		b, err := be.Alloc(n, "x")
		if err != nil {
			t.Fatal(err)
		}
		d := b.(*buffer).bytes()
		if int64(len(d)) != n || uintptr(unsafe.Pointer(unsafe.SliceData(d)))%align != 0 {
			t.Fatalf("buffer of %d: len %d, address %p", n, len(d), unsafe.SliceData(d))
		}
		for i, v := range d {
			if v != 0 {
				t.Fatalf("buffer of %d not zeroed at %d", n, i)
			}
		}
		for i := range d {
			d[i] = 0xff // dirty it: the next Alloc must still be zero
		}
		be.Free(b)
	}
}

func TestPeakNeverExceedsLimitUnderConcurrency(t *testing.T) {
	const limit = 64 << 10
	be := openBE(t, limit)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				b, err := be.Alloc(int64(5<<10+i*7), "w")
				if err != nil {
					if !errors.Is(err, kernels.ErrOutOfMemory) {
						t.Error(err)
					}
					continue
				}
				be.Free(b)
			}
		}()
	}
	wg.Wait()
	st := be.MemStats()
	if st.Peak > limit || st.Allocated != 0 || st.Allocs != st.Frees {
		t.Fatalf("stats after concurrent alloc/free: %+v", st)
	}
}

func TestFreeMisusePanics(t *testing.T) {
	be := openBE(t, 0)
	other := openBE(t, 0)
	b, _ := be.Alloc(16, "x")
	ob, _ := other.Alloc(16, "x")
	be.Free(b)
	for name, f := range map[string]func(){
		"double free":     func() { be.Free(b) },
		"foreign buffer":  func() { be.Free(ob) },
		"use after free":  func() { be.Zero(be.DefaultQueue(), kernels.Tensor{Buf: b, DType: kernels.U8, N: 16}) },
		"foreign queue":   func() { be.Zero(other.DefaultQueue(), kernels.View(ob, 0, kernels.U8, 16)) },
		"nil buffer free": func() { be.Free(nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			f()
		}()
	}
}

func TestQueueOrderAndEvents(t *testing.T) {
	be := openBE(t, 0)
	ctx := context.Background()
	q1 := be.DefaultQueue()
	q2, err := be.NewQueue("h2d")
	if err != nil {
		t.Fatal(err)
	}
	// Work on q1 runs in order: 100 scale-and-add steps give a known result.
	x := upload(t, be, kernels.F32, []float32{1})
	one := upload(t, be, kernels.F32, []float32{1})
	for i := 0; i < 100; i++ {
		be.Scale(q1, x, 2)
		be.Add(q1, x, one)
	}
	// q2 must wait for q1's work before copying x out.
	ev, _ := be.RecordEvent(q1)
	if err := be.WaitEvent(q2, ev); err != nil {
		t.Fatal(err)
	}
	host := make([]byte, 4)
	be.CopyToHost(q2, host, x)
	if err := q2.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	if !ev.Done() {
		t.Fatal("event not done after a queue that waited on it synchronized")
	}
	got := *(*float32)(unsafe.Pointer(&host[0]))
	var want float32 = 1
	for i := 0; i < 100; i++ {
		want = want*2 + 1
	}
	if got != want {
		t.Fatalf("after ordered work x = %v, want %v", got, want)
	}

	// A queue blocked on an event that is not yet passed does not run on.
	gate := make(chan struct{})
	q3, _ := be.NewQueue("gate")
	be.queue(q3).enqueue("gate", func() error { <-gate; return nil })
	ev3, _ := be.RecordEvent(q3)
	be.WaitEvent(q2, ev3)
	be.Fill(q2, x, 7)
	ev2, _ := be.RecordEvent(q2)
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := ev2.Synchronize(tctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Synchronize while blocked: %v, want deadline exceeded", err)
	}
	if ev2.Done() || ev3.Done() {
		t.Fatal("events done before the gate opened")
	}
	close(gate)
	if err := ev2.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	if v := download(t, be, x); v[0] != 7 {
		t.Fatalf("Fill after wait: %v", v)
	}
}

func TestStickyErrors(t *testing.T) {
	be := openBE(t, 0)
	ctx := context.Background()
	q, _ := be.NewQueue("compute2")
	out := upload(t, be, kernels.F32, make([]float32, 2*3))
	wte := upload(t, be, kernels.F32, make([]float32, 4*3))
	wpe := upload(t, be, kernels.F32, make([]float32, 2*3))
	tok := uploadI32(t, be, []int32{1, 9}) // 9 is outside the vocabulary of 4
	be.EncoderForward(q, out, tok, wte, wpe, 1, 2, 3)
	after := upload(t, be, kernels.F32, []float32{5})
	be.Scale(q, after, 2) // skipped: the queue is in error
	ev, _ := be.RecordEvent(q)
	err := q.Synchronize(ctx)
	if err == nil || !strings.Contains(err.Error(), "token 9") || !strings.Contains(err.Error(), "EncoderForward") {
		t.Fatalf("Synchronize = %v, want the token error", err)
	}
	if err2 := q.Synchronize(ctx); err2 == nil || err2.Error() != err.Error() {
		t.Fatalf("error not sticky: %v", err2)
	}
	if e := ev.Synchronize(ctx); e == nil {
		t.Fatal("event recorded after the error reports no error")
	}
	if v := download(t, be, after); v[0] != 5 {
		t.Fatalf("work after a sticky error ran: %v", v)
	}
	// A queue waiting on the failed queue's event inherits the error.
	q2, _ := be.NewQueue("other")
	be.WaitEvent(q2, ev)
	if err := q2.Synchronize(ctx); err == nil {
		t.Fatal("waiting queue did not inherit the error")
	}
	// The default queue is unaffected.
	if err := be.DefaultQueue().Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	if err := be.Close(); err == nil {
		t.Fatal("Close did not report the sticky errors")
	}
}

func TestCloseFreesAndRejects(t *testing.T) {
	be, err := Open(kernels.Config{MemoryLimit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := be.Alloc(1000, "x"); err != nil {
		t.Fatal(err)
	}
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	if st := be.MemStats(); st.Allocated != 0 {
		t.Fatalf("Close left %d bytes allocated", st.Allocated)
	}
	if _, err := be.Alloc(1, "x"); err == nil {
		t.Fatal("Alloc after Close succeeded")
	}
}

func TestConcurrentQueuesShareThePool(t *testing.T) {
	be := openBE(t, 0)
	ctx := context.Background()
	var qs []kernels.Queue
	var xs []kernels.Tensor
	const N = 1 << 16
	for i := 0; i < 4; i++ {
		q, _ := be.NewQueue("q")
		qs = append(qs, q)
		xs = append(xs, upload(t, be, kernels.F32, make([]float32, N)))
	}
	w := upload(t, be, kernels.F32, make([]float32, 64*64))
	be.Fill(be.DefaultQueue(), w, 0.5)
	syncQ(t, be)
	for i, q := range qs {
		for k := 0; k < 20; k++ {
			be.Fill(q, xs[i], float32(i))
			be.Scale(q, xs[i], 2)
			be.MatmulForward(q, xs[i].Slice(0, 64*64), xs[i].Slice(N/2, 64*64), w, kernels.Tensor{}, 64, 64, 64)
		}
	}
	for i, q := range qs {
		if err := q.Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
		v := download(t, be, xs[i])
		if want := float32(i) * 2 * 64 * 0.5; v[0] != want {
			t.Fatalf("queue %d: %v, want %v", i, v[0], want)
		}
	}
}
