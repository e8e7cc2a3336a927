//go:build cuda

package cuda

import (
	"context"
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/spill-ml/spill/kernels"
)

// opCase is one backend call as a GPT training step makes it.
type opCase struct {
	name  string
	flash bool // takes the flash attention kernels
	f     func()
}

// stepOps opens a backend and returns the calls a GPT block's forward and
// backward pass, the loss and the optimizer step make, at a small shape
// (bf16, B 2, T 128, C 256, 4 heads of 64), on operands allocated once.
func stepOps(tb testing.TB) (*Backend, []opCase) {
	be := openCUDA(tb, 1<<30)
	q := be.DefaultQueue()
	const B, T, C, NH, V = 2, 128, 256, 4, 512
	BT := B * T
	tensor := func(dt kernels.DType, n int) kernels.Tensor {
		buf, err := be.Alloc(int64(n*dt.Size()), "test")
		if err != nil {
			tb.Fatal(err)
		}
		return kernels.View(buf, 0, dt, n)
	}
	bf, f32 := kernels.BF16, kernels.F32
	x, y, dx, dy := tensor(bf, BT*C), tensor(bf, BT*C), tensor(bf, BT*C), tensor(bf, BT*C)
	mean, rstd := tensor(f32, BT), tensor(f32, BT)
	lnw, lnb, dlnw, dlnb := tensor(bf, C), tensor(bf, C), tensor(bf, C), tensor(bf, C)
	w, bias, dw, dbias := tensor(bf, 3*C*C), tensor(bf, 3*C), tensor(bf, 3*C*C), tensor(bf, 3*C)
	qkv, dqkv := tensor(bf, BT*3*C), tensor(bf, BT*3*C)
	lse := tensor(f32, B*NH*T)
	logits, dlogits := tensor(bf, BT*V), tensor(bf, BT*V)
	losses, tokens := tensor(f32, BT), tensor(kernels.I32, BT)
	wte, wpe, dwte, dwpe := tensor(bf, V*C), tensor(bf, T*C), tensor(bf, V*C), tensor(bf, T*C)
	p32, m32, v32, g := tensor(f32, C*C), tensor(f32, C*C), tensor(f32, C*C), tensor(bf, C*C)
	stats := tensor(f32, 2)
	host, err := be.AllocPinned(BT * 4)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = be.FreePinned(host) })
	be.Fill(q, x, 0.5)
	be.Fill(q, w, 0.01)
	adam := kernels.AdamWParams{LR: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 1}
	return be, []opCase{
		{name: "Scale", f: func() { be.Scale(q, x, 1) }},
		{name: "Fill", f: func() { be.Fill(q, dy, 0.25) }},
		{name: "Zero", f: func() { be.Zero(q, dx) }},
		{name: "CopyToDevice", f: func() { be.CopyToDevice(q, tokens, host) }},
		{name: "CopyToHost", f: func() { be.CopyToHost(q, host, losses) }},
		{name: "EncoderForward", f: func() { be.EncoderForward(q, x, tokens, wte, wpe, B, T, C) }},
		{name: "LayerNormForward", f: func() { be.LayerNormForward(q, y, mean, rstd, x, lnw, lnb, BT, C) }},
		{name: "MatmulForward", f: func() { be.MatmulForward(q, qkv, y, w, bias, BT, C, 3*C) }},
		{name: "AttentionForward", flash: true, f: func() { be.AttentionForward(q, y, lse, qkv, B, T, C, NH) }},
		{name: "GeluForward", f: func() { be.GeluForward(q, y, x, BT*C) }},
		{name: "MatmulForwardResidual", f: func() { be.MatmulForwardResidual(q, dy, y, w.Slice(0, C*C), bias.Slice(0, C), x, BT, C, C) }},
		{name: "Add", f: func() { be.Add(q, x, y) }},
		{name: "CrossEntropyForward", f: func() { be.CrossEntropyForward(q, losses, logits, tokens, BT, V) }},
		{name: "CrossEntropyBackwardSet", f: func() { be.CrossEntropyBackwardSet(q, dlogits, logits, tokens, BT, V, 1) }},
		{name: "GeluBackwardSet", f: func() { be.GeluBackwardSet(q, dx, x, dy, BT*C) }},
		{name: "AttentionBackwardSet", flash: true, f: func() { be.AttentionBackwardSet(q, dqkv, dy, qkv, y, lse, B, T, C, NH) }},
		{name: "MatmulBackwardSet", f: func() { be.MatmulBackwardSet(q, dx, dw, dbias, dqkv, y, w, BT, C, 3*C) }},
		{name: "LayerNormBackward", f: func() { be.LayerNormBackward(q, dx, dlnw, dlnb, dy, x, lnw, mean, rstd, BT, C) }},
		{name: "EncoderBackward", f: func() { be.EncoderBackward(q, dwte, dwpe, dx, tokens, B, T, C) }},
		{name: "SumSquaresFinite", f: func() { be.SumSquaresFinite(q, stats, g) }},
		{name: "AdamW", f: func() { be.AdamW(q, p32, g, m32, v32, kernels.Tensor{}, adam) }},
	}
}

// TestLaunchAllocs checks that the calls of a training step allocate no Go
// memory in steady state: testing.AllocsPerRun counts the allocations of
// every goroutine, the queue's (which issues the launches) included. C
// allocations are ruled out by construction (launchArgs).
func TestLaunchAllocs(t *testing.T) {
	be, ops := stepOps(t)
	ctx := context.Background()
	for _, c := range ops {
		if c.flash && (be.flashErr != nil || be.flashBwdErr != nil) {
			t.Logf("%s: flash kernels off (%v, %v): not checked", c.name, be.flashErr, be.flashBwdErr)
			continue
		}
		for range 3 { // first use: cuBLAS handles, plans, scratch growth
			c.f()
		}
		if err := be.DefaultQueue().Synchronize(ctx); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if n := testing.AllocsPerRun(200, c.f); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", c.name, n)
		}
	}
	if err := be.DefaultQueue().Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkStepOps enqueues the calls of stepOps once per iteration and
// reports allocations, kernel launches per iteration and the queue
// goroutine's host time per launch (HostStats).
func BenchmarkStepOps(b *testing.B) {
	be, ops := stepOps(b)
	ctx := context.Background()
	run := func() {
		for _, c := range ops {
			c.f()
		}
	}
	run()
	if err := be.DefaultQueue().Synchronize(ctx); err != nil {
		b.Fatal(err)
	}
	j0, l0, t0 := HostStats()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		run()
	}
	if err := be.DefaultQueue().Synchronize(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	j1, l1, t1 := HostStats()
	if l1 > l0 {
		b.ReportMetric(float64(l1-l0)/float64(b.N), "launches/op")
		b.ReportMetric(float64(j1-j0)/float64(b.N), "jobs/op")
		b.ReportMetric(float64((t1-t0)/time.Nanosecond)/float64(l1-l0), "host-ns/launch")
	}
}

// TestInflightBound fills a 256 MiB tensor 1500 times, each fill tens of
// microseconds of device time against a few of host time, so the queue's
// goroutine must wait for the device under the in-flight bound
// (queue.marks): HostWait has to grow. The last fill's value must be the
// one read back, first and last element: the waits keep the order.
func TestInflightBound(t *testing.T) {
	be := openCUDA(t, 1<<30)
	const n = 64 << 20 // float32 elements
	buf, err := be.Alloc(4*n, "test")
	if err != nil {
		t.Fatal(err)
	}
	x := kernels.View(buf, 0, kernels.F32, n)
	q := be.DefaultQueue()
	w0 := HostWait()
	const fills = 1500
	for i := range fills {
		be.Fill(q, x, float32(i))
	}
	got := make([]byte, 4*n)
	be.CopyToHost(q, got, x)
	if err := q.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w := HostWait() - w0; w <= 0 {
		t.Errorf("HostWait grew by %v over %d fills of %d MiB: the queue never waited for the device", w, fills, 4*n>>20)
	}
	for _, i := range []int{0, n - 1} {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:])); v != fills-1 {
			t.Errorf("element %d = %g after the fills, want %d", i, v, fills-1)
		}
	}
}

// TestEncodedMaps holds the queue's memo of tensor maps (encodedMaps) to
// what the driver encodes afresh: the same description gives the same
// remembered maps, a different one other maps, a bad one an error that
// names the map, and the memo never grows past maxEncodedMaps.
func TestEncodedMaps(t *testing.T) {
	be := openCUDA(t, 1<<30)
	buf, err := be.Alloc(4<<20, "test")
	if err != nil {
		t.Fatal(err)
	}
	x := be.devPtr(kernels.View(buf, 0, kernels.BF16, 2<<20), "TestEncodedMaps", "x")
	job2 := func(rows int) job {
		return launchJob(0, dim3{x: 1}, dim3{x: 1}, aI32(7)).withTensorMaps(tensorMapOf{x, 384, 1024, 2, rows},
			tensorMapOf{x + 4096, 128, 1024, 2, 64})
	}
	if v := buildCUDAVersion(); v < 12000 {
		t.Skipf("built against CUDA %d: no tensor maps", v)
	}
	q := be.defq
	done := make(chan struct{})
	// On the queue's goroutine, where the context is current: errors are
	// reported with Errorf and the closure returns (no Fatal off the test's
	// goroutine).
	q.enqueue(func(q *queue) error {
		defer close(done)
		j := job2(64)
		if j.n != 2 || j.maps != 2 || j.args[0] != 7 {
			t.Errorf("withTensorMaps: n %d, maps %d, args[0] %d; want 2, 2, 7", j.n, j.maps, j.args[0])
		}
		m1, err := q.encodedMaps(&j)
		if err != nil {
			t.Error(err)
			return nil
		}
		var fresh tensorMaps
		if err := j.encodeMaps(&fresh); err != nil {
			t.Error(err)
			return nil
		}
		if *m1 != fresh {
			t.Error("remembered maps differ from the maps encoded afresh")
		}
		again := job2(64)
		if m2, err := q.encodedMaps(&again); err != nil || m2 != m1 {
			t.Errorf("same description: maps at %p (%v), want the remembered %p", m2, err, m1)
		}
		other := job2(128)
		m3, err := q.encodedMaps(&other)
		if err != nil || m3 == m1 || *m3 == *m1 {
			t.Errorf("boxes of 128 rows: maps at %p equal to the 64-row ones at %p (%v)", m3, m1, err)
		}
		one := launchJob(0, dim3{x: 1}, dim3{x: 1}).withTensorMaps(tensorMapOf{x, 384, 1024, 2, 64})
		if m4, err := q.encodedMaps(&one); err != nil || m4 == m1 || [16]uint64(m4[:16]) != [16]uint64(m1[:16]) {
			t.Errorf("the first map alone: %p (%v), want its own maps with m1's first 128 bytes", m4, err)
		}
		bad := launchJob(0, dim3{x: 1}, dim3{x: 1}).withTensorMaps(tensorMapOf{x + 2, 384, 1024, 2, 64})
		if _, err := q.encodedMaps(&bad); err == nil || !strings.Contains(err.Error(), "tensor map 0") {
			t.Errorf("a map of an address not 16-byte aligned: %v, want an error naming tensor map 0", err)
		}
		for i := range maxEncodedMaps + 10 {
			j := launchJob(0, dim3{x: 1}, dim3{x: 1}).withTensorMaps(tensorMapOf{x, 64, 1 + i, 1, 64})
			if _, err := q.encodedMaps(&j); err != nil {
				t.Error(err)
				return nil
			}
			if len(q.tmaps) > maxEncodedMaps {
				t.Errorf("%d maps remembered, at most %d", len(q.tmaps), maxEncodedMaps)
				return nil
			}
		}
		return nil
	})
	<-done
	if err := q.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
}
