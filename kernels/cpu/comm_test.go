package cpu

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spill-ml/spill/kernels"
)

// openWorld opens n CPU backends and joins them into one communicator,
// each rank from its own goroutine as separate processes would.
func openWorld(t testing.TB, n int) ([]*Backend, []kernels.Comm) {
	t.Helper()
	bes := make([]*Backend, n)
	for i := range bes {
		bes[i] = openBE(t, 0)
	}
	return bes, joinWorld(t, bes)
}

// openFailingWorld is openWorld for tests whose collectives fail: the
// backends' sticky errors at Close are expected.
func openFailingWorld(t testing.TB, n int) ([]*Backend, []kernels.Comm) {
	t.Helper()
	bes := make([]*Backend, n)
	for i := range bes {
		be, err := Open(kernels.Config{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = be.Close() })
		bes[i] = be
	}
	return bes, joinWorld(t, bes)
}

func joinWorld(t testing.TB, bes []*Backend) []kernels.Comm {
	t.Helper()
	n := len(bes)
	id, err := bes[0].NewCommID()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
	t.Cleanup(func() {
		for _, c := range comms {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	return comms
}

// rawUpload allocates a tensor of dtype dt holding vals rounded to dt.
func rawUpload(t testing.TB, be *Backend, dt kernels.DType, vals []float32) kernels.Tensor {
	t.Helper()
	if len(vals) == 0 {
		buf, err := be.Alloc(0, "test")
		if err != nil {
			t.Fatal(err)
		}
		return kernels.View(buf, 0, dt, 0)
	}
	return upload(t, be, dt, vals)
}

func rawDownload(t testing.TB, be *Backend, tt kernels.Tensor) []byte {
	t.Helper()
	host := make([]byte, tt.Bytes())
	be.CopyToHost(be.DefaultQueue(), host, tt)
	syncQ(t, be)
	return host
}

// spreadVals returns n values of magnitudes between 1e-3 and 1e3, so that
// the order of a float32 sum changes its bits.
func spreadVals(r *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(7)-3)))
	}
	return out
}

// roundAll returns vals rounded to dt and back to float32.
func roundAll(dt kernels.DType, vals []float32) []float32 {
	out := make([]float32, len(vals))
	for i, v := range vals {
		out[i] = roundTo(dt, v)
	}
	return out
}

// encode stores float32 values as little-endian dt (rounding once).
func encode(dt kernels.DType, vals []float32) []byte {
	src := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(v))
	}
	out := make([]byte, len(vals)*dt.Size())
	kernels.ConvertBytes(out, dt, src, kernels.F32)
	return out
}

// refSum is the reference: per element x0 + x1 + ... in float32 in the
// given rank order, rounded once to dt.
func refSum(dt kernels.DType, inputs [][]float32, order []int) []byte {
	acc := append([]float32(nil), roundAll(dt, inputs[order[0]])...)
	for _, r := range order[1:] {
		for i, v := range roundAll(dt, inputs[r]) {
			acc[i] += v
		}
	}
	return encode(dt, acc)
}

func ranks(n int) []int {
	o := make([]int, n)
	for i := range o {
		o[i] = i
	}
	return o
}

func syncAll(t testing.TB, bes []*Backend) {
	t.Helper()
	for _, be := range bes {
		syncQ(t, be)
	}
}

func TestCommAllReduceMatchesRankOrderSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	orderMattered := false
	for _, size := range []int{1, 2, 3, 4, 5} {
		bes, comms := openWorld(t, size)
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
			for _, n := range []int{0, 1, 7, 1000} {
				for _, inPlace := range []bool{false, true} {
					inputs := make([][]float32, size)
					src, dst := make([]kernels.Tensor, size), make([]kernels.Tensor, size)
					for r := range size {
						inputs[r] = spreadVals(rng, n)
						src[r] = rawUpload(t, bes[r], dt, inputs[r])
						dst[r] = src[r]
						if !inPlace {
							dst[r] = rawUpload(t, bes[r], dt, make([]float32, n))
						}
					}
					// Enqueue from the last rank to the first: arrival order
					// must not matter.
					for r := size - 1; r >= 0; r-- {
						comms[r].AllReduce(bes[r].DefaultQueue(), dst[r], src[r])
					}
					syncAll(t, bes)
					want := refSum(dt, inputs, ranks(size))
					for r := range size {
						if got := rawDownload(t, bes[r], dst[r]); !bytes.Equal(got, want) {
							t.Fatalf("size %d %v n=%d inPlace=%v: rank %d differs from the rank-order sum", size, dt, n, inPlace, r)
						}
					}
					rev := ranks(size)
					for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
						rev[i], rev[j] = rev[j], rev[i]
					}
					if !bytes.Equal(refSum(dt, inputs, rev), want) {
						orderMattered = true
					}
					for r := range size {
						if !inPlace {
							bes[r].Free(dst[r].Buf)
						}
						bes[r].Free(src[r].Buf)
					}
				}
			}
		}
	}
	if !orderMattered {
		t.Fatal("no input where the summation order changes the bits: the test does not check the order")
	}
}

func TestCommReduceScatterAllGatherBroadcast(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const size = 3
	bes, comms := openWorld(t, size)
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		for _, shard := range []int{1, 5} {
			for _, inPlace := range []bool{false, true} {
				// ReduceScatter of size*shard elements.
				inputs := make([][]float32, size)
				src, dst := make([]kernels.Tensor, size), make([]kernels.Tensor, size)
				for r := range size {
					inputs[r] = spreadVals(rng, size*shard)
					src[r] = rawUpload(t, bes[r], dt, inputs[r])
					if inPlace {
						dst[r] = src[r].Slice(r*shard, shard)
					} else {
						dst[r] = rawUpload(t, bes[r], dt, make([]float32, shard))
					}
					comms[r].ReduceScatter(bes[r].DefaultQueue(), dst[r], src[r])
				}
				syncAll(t, bes)
				sum := refSum(dt, inputs, ranks(size))
				es := dt.Size()
				for r := range size {
					if got, want := rawDownload(t, bes[r], dst[r]), sum[r*shard*es:(r+1)*shard*es]; !bytes.Equal(got, want) {
						t.Fatalf("%v shard %d inPlace=%v: ReduceScatter rank %d: got %x, want %x", dt, shard, inPlace, r, got, want)
					}
				}

				// AllGather of shard elements per rank.
				var all []byte
				for r := range size {
					vals := spreadVals(rng, shard)
					all = append(all, encode(dt, vals)...)
					if inPlace {
						dst[r] = rawUpload(t, bes[r], dt, make([]float32, size*shard))
						bes[r].CopyToDevice(bes[r].DefaultQueue(), dst[r].Slice(r*shard, shard), encode(dt, vals))
						src[r] = dst[r].Slice(r*shard, shard)
					} else {
						src[r] = rawUpload(t, bes[r], dt, vals)
						dst[r] = rawUpload(t, bes[r], dt, make([]float32, size*shard))
					}
				}
				for r := range size {
					comms[r].AllGather(bes[r].DefaultQueue(), dst[r], src[r])
				}
				syncAll(t, bes)
				for r := range size {
					if got := rawDownload(t, bes[r], dst[r]); !bytes.Equal(got, all) {
						t.Fatalf("%v shard %d inPlace=%v: AllGather rank %d: got %x, want %x", dt, shard, inPlace, r, got, all)
					}
				}

				// Broadcast from rank 1; the others pass no src.
				vals := spreadVals(rng, shard)
				for r := range size {
					dst[r] = rawUpload(t, bes[r], dt, make([]float32, shard))
					var s kernels.Tensor
					if r == 1 {
						s = rawUpload(t, bes[r], dt, vals)
						if inPlace {
							dst[r] = s
						}
					}
					comms[r].Broadcast(bes[r].DefaultQueue(), dst[r], s, 1)
				}
				syncAll(t, bes)
				for r := range size {
					if got, want := rawDownload(t, bes[r], dst[r]), encode(dt, vals); !bytes.Equal(got, want) {
						t.Fatalf("%v inPlace=%v: Broadcast rank %d: got %x, want %x", dt, inPlace, r, got, want)
					}
				}
			}
		}
	}
}

// TestCommUnevenShards checks the padding rule of kernels.ShardLen and
// ShardRange: 10 elements over 4 ranks are padded to 12, reduce-scattered
// 3 per rank and gathered back, and the real elements survive.
func TestCommUnevenShards(t *testing.T) {
	const n, size = 10, 4
	bes, comms := openWorld(t, size)
	l := kernels.ShardLen(n, size)
	inputs := make([][]float32, size)
	full, shard := make([]kernels.Tensor, size), make([]kernels.Tensor, size)
	for r := range size {
		inputs[r] = make([]float32, l*size) // padding stays zero
		for i := range n {
			inputs[r][i] = float32(100*r + i)
		}
		full[r] = rawUpload(t, bes[r], kernels.F32, inputs[r])
		shard[r] = rawUpload(t, bes[r], kernels.F32, make([]float32, l))
		comms[r].ReduceScatter(bes[r].DefaultQueue(), shard[r], full[r])
		comms[r].AllGather(bes[r].DefaultQueue(), full[r], shard[r])
	}
	syncAll(t, bes)
	for r := range size {
		lo, hi := kernels.ShardRange(n, size, r)
		got := download(t, bes[r], shard[r])
		for i := lo; i < hi; i++ {
			if want := float32(600 + 4*i); got[i-lo] != want {
				t.Fatalf("rank %d owns [%d, %d): element %d is %v, want %v", r, lo, hi, i, got[i-lo], want)
			}
		}
		for i := hi - lo; i < l; i++ {
			if got[i] != 0 {
				t.Fatalf("rank %d: padding element %d is %v, want 0", r, i, got[i])
			}
		}
		back := download(t, bes[r], full[r])
		for i := range n {
			if want := float32(600 + 4*i); back[i] != want {
				t.Fatalf("rank %d: gathered element %d is %v, want %v", r, i, back[i], want)
			}
		}
	}
}

// TestCommManyQueuesDeterministic runs a sequence of collectives spread
// over two queues per rank, twice, and wants the same bits both times.
func TestCommManyQueuesDeterministic(t *testing.T) {
	run := func() [][]byte {
		const size, n = 4, 257
		bes, comms := openWorld(t, size)
		rng := rand.New(rand.NewPCG(5, 6))
		var out [][]byte
		ts := make([][]kernels.Tensor, size)
		qs := make([][2]kernels.Queue, size)
		for r := range size {
			q2, err := bes[r].NewQueue("comm")
			if err != nil {
				t.Fatal(err)
			}
			qs[r] = [2]kernels.Queue{bes[r].DefaultQueue(), q2}
			for range 6 {
				ts[r] = append(ts[r], rawUpload(t, bes[r], kernels.F32, spreadVals(rng, n)))
			}
		}
		for k := range 6 {
			for r := range size {
				comms[r].AllReduce(qs[r][k%2], ts[r][k], ts[r][k])
			}
		}
		for r := range size {
			for _, q := range qs[r] {
				if err := q.Synchronize(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			for _, tt := range ts[r] {
				out = append(out, rawDownload(t, bes[r], tt))
			}
		}
		return out
	}
	a, b := run(), run()
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			t.Fatalf("tensor %d differs between two runs", i)
		}
	}
}

func TestCommMismatchFailsEveryRank(t *testing.T) {
	bes, comms := openFailingWorld(t, 2)
	a := rawUpload(t, bes[0], kernels.F32, make([]float32, 4))
	b := rawUpload(t, bes[1], kernels.F32, make([]float32, 5))
	comms[0].AllReduce(bes[0].DefaultQueue(), a, a)
	comms[1].AllReduce(bes[1].DefaultQueue(), b, b)
	for r, be := range bes {
		err := be.DefaultQueue().Synchronize(context.Background())
		if err == nil || !strings.Contains(err.Error(), "differs between ranks") {
			t.Fatalf("rank %d: %v, want a mismatch error", r, err)
		}
	}
}

func TestCommAbortReleasesWaiters(t *testing.T) {
	bes, comms := openFailingWorld(t, 2)
	a := rawUpload(t, bes[0], kernels.F32, make([]float32, 4))
	comms[0].AllReduce(bes[0].DefaultQueue(), a, a) // rank 1 never joins
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := bes[0].DefaultQueue().Synchronize(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Synchronize with rank 1 absent: %v, want a deadline", err)
	}
	if err := comms[1].Abort(); err != nil {
		t.Fatal(err)
	}
	if err := bes[0].DefaultQueue().Synchronize(context.Background()); !errors.Is(err, kernels.ErrCommAborted) {
		t.Fatalf("after Abort: %v, want ErrCommAborted", err)
	}
}

func TestCommCloseFailsWaitingRanks(t *testing.T) {
	bes, comms := openFailingWorld(t, 2)
	a := rawUpload(t, bes[0], kernels.F32, make([]float32, 4))
	comms[0].AllReduce(bes[0].DefaultQueue(), a, a)
	if err := comms[1].Close(); err != nil {
		t.Fatal(err)
	}
	err := bes[0].DefaultQueue().Synchronize(context.Background())
	if err == nil || !strings.Contains(err.Error(), "rank 1 ") || !strings.Contains(err.Error(), "closed the communicator") {
		t.Fatalf("rank 0 after rank 1 closed: %v", err)
	}
}

func TestOpenCommErrors(t *testing.T) {
	be := openBE(t, 0)
	id, err := be.NewCommID()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := be.OpenComm(ctx, id, 0, 2); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 of 2 joined") {
		t.Fatalf("rank 1 absent: %v", err)
	}
	for _, tc := range []struct {
		id         []byte
		rank, size int
		want       string
	}{
		{id, 2, 2, "rank 2 of 2 ranks is out of range"},
		{[]byte("nccl garbage"), 0, 1, "not an id from the cpu backend"},
		{[]byte(commIDPrefix + "1/00"), 0, 1, "comes from process 1"},
	} {
		if _, err := be.OpenComm(context.Background(), tc.id, tc.rank, tc.size); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OpenComm(%q, %d, %d): %v, want %q", tc.id, tc.rank, tc.size, err, tc.want)
		}
	}

	// A wrong size and a duplicate rank while rank 0 waits.
	id2, _ := be.NewCommID()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	done := make(chan error, 1)
	go func() {
		c, err := be.OpenComm(ctx2, id2, 0, 2)
		if err == nil {
			err = c.Close()
		}
		done <- err
	}()
	waitPending(t, string(id2))
	be2 := openBE(t, 0)
	if _, err := be2.OpenComm(context.Background(), id2, 1, 3); err == nil || !strings.Contains(err.Error(), "expects 3 ranks") {
		t.Fatalf("wrong size: %v", err)
	}
	if _, err := be2.OpenComm(context.Background(), id2, 0, 2); err == nil || !strings.Contains(err.Error(), "joined twice") {
		t.Fatalf("duplicate rank: %v", err)
	}
	c1, err := be2.OpenComm(context.Background(), id2, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// waitPending waits until some rank has joined communicator id.
func waitPending(t *testing.T, id string) {
	t.Helper()
	for range 500 {
		commRegistry.Lock()
		_, ok := commRegistry.pending[id]
		commRegistry.Unlock()
		if ok {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("rank 0 never joined")
}

func TestCommMisusePanics(t *testing.T) {
	bes, comms := openWorld(t, 2)
	other := openBE(t, 0)
	q := bes[0].DefaultQueue()
	f4 := rawUpload(t, bes[0], kernels.F32, make([]float32, 4))
	f6 := rawUpload(t, bes[0], kernels.F32, make([]float32, 6))
	b4 := rawUpload(t, bes[0], kernels.BF16, make([]float32, 4))
	i4 := uploadI32(t, bes[0], make([]int32, 4))
	foreign := rawUpload(t, other, kernels.F32, make([]float32, 4))
	q2, err := bes[0].NewQueue("other")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    func()
		want string
	}{
		{"dtype", func() { comms[0].AllReduce(q, f4, b4) }, "dst is f32, src bf16"},
		{"int sum", func() { comms[0].AllReduce(q, i4, i4) }, "need a float dtype"},
		{"count", func() { comms[0].AllReduce(q, f4, f6) }, "dst has 4 elements, want 6"},
		{"scatter", func() { comms[0].ReduceScatter(q, f4, f6) }, "want 2 ranks x dst's 4"},
		{"gather", func() { comms[0].AllGather(q, f6, f4) }, "dst has 6 elements, want 8"},
		{"root", func() { comms[0].Broadcast(q, f4, f4, 2) }, "root 2 of 2"},
		{"root src", func() { comms[0].Broadcast(q, f4, kernels.Tensor{}, 0) }, "absent src on the root"},
		{"foreign", func() { comms[0].AllReduce(q, foreign, foreign) }, "another backend"},
		{"group queue", func() {
			comms[0].GroupStart(q)
			defer comms[0].GroupEnd(q)
			comms[0].AllReduce(q2, f4, f4)
		}, "inside a group opened on queue compute"},
		{"group end", func() { comms[0].GroupEnd(q) }, "without a GroupStart"},
	} {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), tc.want) {
					t.Errorf("%s: panic %v, want %q", tc.name, r, tc.want)
				}
			}()
			tc.f()
		}()
	}
	// A group on the right queue works (rank 1 runs the same collectives).
	as := make([]kernels.Tensor, 2)
	for r := range 2 {
		as[r] = rawUpload(t, bes[r], kernels.F32, []float32{1, 2})
		c := rawUpload(t, bes[r], kernels.F32, []float32{3, 4, 5, 6})
		comms[r].GroupStart(bes[r].DefaultQueue())
		comms[r].AllReduce(bes[r].DefaultQueue(), as[r], as[r])
		comms[r].AllGather(bes[r].DefaultQueue(), c, c.Slice(2*r, 2))
		comms[r].GroupEnd(bes[r].DefaultQueue())
	}
	for r := range 2 {
		if got := download(t, bes[r], as[r]); got[0] != 2 || got[1] != 4 {
			t.Errorf("rank %d: all-reduce in a group gave %v, want [2 4]", r, got)
		}
	}
}
