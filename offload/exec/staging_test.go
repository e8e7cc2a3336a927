package exec

import (
	"context"
	"testing"

	"github.com/spill-ml/spill/kernels"
	_ "github.com/spill-ml/spill/kernels/cpu"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/stream"
)

// TestStagingChunks: a tensor larger than a staging buffer goes to the
// device and back in chunks, reusing the ring's buffers, unchanged.
func TestStagingChunks(t *testing.T) {
	be, err := kernels.Open("cpu", kernels.Config{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	r, err := NewStaging(be, offload.HostConfig{Budget: 1 << 30, StagingSize: 64 << 10, Pinner: offload.MmapPinner{},
		ReadLimits: func() (offload.Limits, error) { return offload.Limits{Memlock: -1, MemAvailable: 200 << 10}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ss, err := stream.NewSet(be, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	const n = 3*(64<<10)/2 + 7 // bf16 elements: over four chunks
	buf, err := be.Alloc(2*n, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer be.Free(buf)
	dev := kernels.View(buf, 0, kernels.BF16, n)
	src, back := make([]byte, 2*n), make([]byte, 2*n)
	for i := range src {
		src[i] = byte(i*7 + i/251)
	}
	ctx := context.Background()
	if err := r.CopyIn(ctx, ss.H2D, "in", dev, src); err != nil {
		t.Fatal(err)
	}
	if err := ss.D2H.WaitFor(ss.H2D); err != nil {
		t.Fatal(err)
	}
	if err := r.CopyOut(ctx, ss.D2H, "out", back, dev); err != nil {
		t.Fatal(err)
	}
	if err := ss.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	if string(back) != string(src) {
		t.Fatal("the round trip through the staging ring changed the data")
	}
	if r.Chunks != 8 {
		t.Errorf("%d chunks staged, want 4 each way", r.Chunks)
	}
	if len(r.bufs) != 2 || r.Bytes() > 200<<10 {
		t.Fatalf("ring of %d buffers, %d bytes", len(r.bufs), r.Bytes())
	}
}
