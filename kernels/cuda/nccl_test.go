//go:build cuda

package cuda

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/spill-ml/spill/kernels"
	"gorgonia.org/cu"
)

// ncclWorld opens a CUDA backend on each of devices 0..n-1 and joins them
// into one NCCL communicator, each rank from its own goroutine.
func ncclWorld(t *testing.T, n int) ([]*Backend, []kernels.Comm) {
	t.Helper()
	bes := make([]*Backend, n)
	for d := range n {
		be, err := Open(kernels.Config{Device: d, MemoryLimit: 1 << 30})
		if err != nil {
			t.Fatalf("device %d: %v", d, err)
		}
		t.Cleanup(func() {
			if err := be.Close(); err != nil {
				t.Errorf("device %d: Close: %v", d, err)
			}
		})
		bes[d] = be
	}
	id, err := bes[0].NewCommID()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	comms := make([]kernels.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { comms[r], errs[r] = bes[r].OpenComm(ctx, id, r, n) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// Registered after the backends' cleanups, so it runs before them.
	t.Cleanup(func() {
		for r, c := range comms {
			if err := c.Close(); err != nil {
				t.Errorf("rank %d: Close: %v", r, err)
			}
		}
	})
	return bes, comms
}

func devUpload(t *testing.T, be *Backend, dt kernels.DType, host []byte) kernels.Tensor {
	t.Helper()
	buf, err := be.Alloc(int64(len(host)), "test")
	if err != nil {
		t.Fatal(err)
	}
	tt := kernels.View(buf, 0, dt, len(host)/dt.Size())
	be.CopyToDevice(be.DefaultQueue(), tt, host)
	return tt
}

func devDownload(t *testing.T, be *Backend, tt kernels.Tensor) []byte {
	t.Helper()
	host := make([]byte, tt.Bytes())
	be.CopyToHost(be.DefaultQueue(), host, tt)
	if err := be.DefaultQueue().Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	return host
}

func randFloats(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// TestNCCLWorldSize1 runs every collective through the real NCCL path with
// one rank: all-reduce, reduce-scatter, all-gather and broadcast are then
// copies, bit for bit.
func TestNCCLWorldSize1(t *testing.T) {
	userNVLS, userSet := os.LookupEnv("NCCL_NVLS_ENABLE")
	bes, comms := ncclWorld(t, 1)
	be, c := bes[0], comms[0]
	v, err := NCCLVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NCCL %s", v)
	if got := os.Getenv("NCCL_NVLS_ENABLE"); userSet && got != userNVLS || !userSet && got != "0" {
		t.Errorf("NCCL_NVLS_ENABLE=%q after loading NCCL (the user's: %q, set %v)", got, userNVLS, userSet)
	}
	if c.Rank() != 0 || c.Size() != 1 {
		t.Fatalf("rank %d of %d", c.Rank(), c.Size())
	}
	rng := rand.New(rand.NewPCG(7, 8))
	q := be.DefaultQueue()
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		for _, n := range []int{1, 1000, 1 << 20} {
			in := encode(dt, randFloats(rng, n))
			src := devUpload(t, be, dt, in)
			outs := map[string]kernels.Tensor{}
			for _, op := range []string{"AllReduce", "ReduceScatter", "AllGather", "Broadcast"} {
				dst := devUpload(t, be, dt, make([]byte, len(in)))
				outs[op] = dst
				switch op {
				case "AllReduce":
					c.AllReduce(q, dst, src)
				case "ReduceScatter":
					c.ReduceScatter(q, dst, src)
				case "AllGather":
					c.AllGather(q, dst, src)
				case "Broadcast":
					c.Broadcast(q, dst, src, 0)
				}
			}
			inPlace := devUpload(t, be, dt, in)
			c.AllReduce(q, inPlace, inPlace)
			outs["AllReduce in place"] = inPlace
			for op, dst := range outs {
				if got := devDownload(t, be, dst); !bytes.Equal(got, in) {
					t.Fatalf("%v n=%d: %s with one rank changed the data", dt, n, op)
				}
				be.Free(dst.Buf)
			}
			be.Free(src.Buf)
		}
	}
	// Integers travel as bytes; a group of two collectives on one queue.
	ints := make([]byte, 4*77)
	for i := range ints {
		ints[i] = byte(rng.Uint32())
	}
	a, b := devUpload(t, be, kernels.I32, ints), devUpload(t, be, kernels.I32, make([]byte, len(ints)))
	f := encode(kernels.F32, randFloats(rng, 33))
	x := devUpload(t, be, kernels.F32, f)
	c.GroupStart(q)
	c.AllGather(q, b, a)
	c.AllReduce(q, x, x)
	c.GroupEnd(q)
	if got := devDownload(t, be, b); !bytes.Equal(got, ints) {
		t.Fatal("AllGather of i32 in a group changed the data")
	}
	if got := devDownload(t, be, x); !bytes.Equal(got, f) {
		t.Fatal("AllReduce in a group changed the data")
	}
}

// TestNCCLTwoRanks checks the collectives between two GPUs against sums
// computed on the host (with two ranks, one rounding: exact).
func TestNCCLTwoRanks(t *testing.T) {
	if err := driverInit(); err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	if n, err := cu.NumDevices(); err != nil || n < 2 {
		t.Skipf("needs 2 GPUs, found %d (%v)", n, err)
	}
	bes, comms := ncclWorld(t, 2)
	rng := rand.New(rand.NewPCG(9, 10))
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		const shard = 4099
		vals := [2][]float32{randFloats(rng, 2*shard), randFloats(rng, 2*shard)}
		var sum []float32
		for i := range vals[0] {
			a := decode(dt, encode(dt, vals[0][i:i+1]))[0]
			b := decode(dt, encode(dt, vals[1][i:i+1]))[0]
			sum = append(sum, a+b)
		}
		want := encode(dt, sum)
		es := dt.Size()
		red, scat, gath, bc := make([]kernels.Tensor, 2), make([]kernels.Tensor, 2), make([]kernels.Tensor, 2), make([]kernels.Tensor, 2)
		for r, be := range bes {
			q := be.DefaultQueue()
			src := devUpload(t, be, dt, encode(dt, vals[r]))
			red[r] = devUpload(t, be, dt, make([]byte, 2*shard*es))
			scat[r] = devUpload(t, be, dt, make([]byte, shard*es))
			gath[r] = devUpload(t, be, dt, make([]byte, 2*shard*es))
			bc[r] = devUpload(t, be, dt, make([]byte, 2*shard*es))
			comms[r].AllReduce(q, red[r], src)
			comms[r].ReduceScatter(q, scat[r], src)
			comms[r].AllGather(q, gath[r], src.Slice(0, shard))
			var root kernels.Tensor
			if r == 1 {
				root = src
			}
			comms[r].Broadcast(q, bc[r], root, 1)
		}
		for r, be := range bes {
			if got := devDownload(t, be, red[r]); !bytes.Equal(got, want) {
				t.Errorf("%v rank %d: AllReduce differs from the host sum", dt, r)
			}
			if got := devDownload(t, be, scat[r]); !bytes.Equal(got, want[r*shard*es:(r+1)*shard*es]) {
				t.Errorf("%v rank %d: ReduceScatter differs from the host sum", dt, r)
			}
			wantG := append(encode(dt, vals[0][:shard]), encode(dt, vals[1][:shard])...)
			if got := devDownload(t, be, gath[r]); !bytes.Equal(got, wantG) {
				t.Errorf("%v rank %d: AllGather differs", dt, r)
			}
			if got := devDownload(t, be, bc[r]); !bytes.Equal(got, encode(dt, vals[1])) {
				t.Errorf("%v rank %d: Broadcast from rank 1 differs", dt, r)
			}
		}
	}
}
