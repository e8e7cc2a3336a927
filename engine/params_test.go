package engine

import (
	"fmt"
	"hash/fnv"
	"math"
	"runtime"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// initSerial is the single-goroutine initialisation: each normal tensor
// filled from the start of its stream in one pass.
func initSerial(dst []float32, specs []ParamSpec, seed uint64) {
	for _, p := range specs {
		t := dst[p.Offset : p.Offset+p.Elems()]
		switch p.Init {
		case InitZeros:
			clear(t)
		case InitOnes:
			for i := range t {
				t[i] = 1
			}
		default:
			newTensorRNG(seed, p.Name).fillNormal(t, p.Std)
		}
	}
}

// TestInitParallelMatchesSerial: InitParams, which fills tensors in chunks
// on several goroutines, gives every layer of a small GPT the bits of the
// serial pass, with 1, 2 and 5 goroutines. The vocabulary and width are
// odd (wte: 50257 x 63 elements, an odd count split into 49 chunks, the
// last one odd), and the hash of all values is pinned, so the values of a
// seed stay those that checkpoints and golden runs were made with.
func TestInitParallelMatchesSerial(t *testing.T) {
	m, err := NewGPT(GPTShape{Layers: 2, Heads: 3, Embd: 63, Vocab: 50257, MaxSeq: 16}, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	h := fnv.New64a()
	for _, l := range m.Layers {
		want := make([]float32, l.NumParams())
		initSerial(want, l.Params(), 1337)
		for _, v := range want {
			h.Write(fmt.Appendf(nil, "%08x", math.Float32bits(v)))
		}
		for _, procs := range []int{1, 2, 5} {
			runtime.GOMAXPROCS(procs)
			got := make([]float32, l.NumParams())
			for i := range got {
				got[i] = float32(math.NaN()) // InitParams must write every element
			}
			InitParams(got, l.Params(), 1337)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s, GOMAXPROCS %d: element %d = %v, serial %v", l.Name(), procs, i, got[i], want[i])
				}
			}
		}
	}
	if got, want := h.Sum64(), uint64(goldenInitHash); got != want {
		t.Errorf("hash of the initial values %#x, want %#x (the values of a seed changed)", got, want)
	}
}

const goldenInitHash = 0x4050d91456a8b888

// BenchmarkInitParams: one gpt2-124m block (7.1M parameters).
func BenchmarkInitParams(b *testing.B) {
	blk := newBlock(GPTShape{Layers: 12, Heads: 12, Embd: 768, Vocab: 50257, MaxSeq: 1024}, kernels.BF16, 0)
	dst := make([]float32, blk.NumParams())
	b.SetBytes(int64(4 * len(dst)))
	b.ResetTimer()
	for range b.N {
		InitParams(dst, blk.Params(), 1)
	}
	b.ReportMetric(float64(len(dst))*float64(b.N)/b.Elapsed().Seconds(), "params/s")
}
