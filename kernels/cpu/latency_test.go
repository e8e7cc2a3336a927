package cpu

import (
	"context"
	"testing"
	"time"

	"github.com/spill-ml/spill/kernels"
)

// TestCopyLatency: a simulated link makes a copy last at least its fixed
// cost plus bytes/bandwidth, leaves other queues running meanwhile, and
// events record when their queue passed them.
func TestCopyLatency(t *testing.T) {
	be := openBE(t, 1<<20)
	ctx := context.Background()
	buf, err := be.Alloc(4096, "weights")
	if err != nil {
		t.Fatal(err)
	}
	x := kernels.View(buf, 0, kernels.F32, 1024)
	host := make([]byte, 4096)
	link, err := be.NewQueue("h2d")
	if err != nil {
		t.Fatal(err)
	}
	const fixed = 200 * time.Millisecond
	be.SetCopyLatency(fixed, 4096/(20*time.Millisecond).Seconds()) // 4 KiB take 20 ms more
	begin, _ := be.RecordEvent(link)
	be.CopyToDevice(link, x, host)
	end, err := be.RecordEvent(link)
	if err != nil {
		t.Fatal(err)
	}
	// Compute on another queue finishes while the copy is in flight.
	y, err := be.Alloc(64, "scratch")
	if err != nil {
		t.Fatal(err)
	}
	be.Fill(be.DefaultQueue(), kernels.View(y, 0, kernels.F32, 16), 1)
	if err := be.DefaultQueue().Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	if end.Done() {
		t.Error("a 220 ms copy finished before a fill on another queue")
	}
	if err := end.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
	t0, ok0 := begin.(*event).PassedAt()
	t1, ok1 := end.(*event).PassedAt()
	if !ok0 || !ok1 {
		t.Fatal("passed events have no time")
	}
	if d := t1.Sub(t0); d < fixed+20*time.Millisecond {
		t.Errorf("the copy took %v, want at least %v", d, fixed+20*time.Millisecond)
	}
	be.SetCopyLatency(0, 0)
	if be.copyTime(1<<20) != 0 {
		t.Error("copy latency still on after SetCopyLatency(0, 0)")
	}
}
