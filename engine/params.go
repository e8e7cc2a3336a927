package engine

import (
	"hash/fnv"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// Init says how a parameter tensor is initialised.
type Init uint8

// Initialisations.
const (
	InitNormal Init = iota // N(0, Std²)
	InitZeros
	InitOnes
)

// ParamSpec describes one parameter tensor of a Layer: its place in the
// layer's contiguous parameter block and how the optimizer treats it.
type ParamSpec struct {
	// Name is the tensor's nanoGPT state_dict name
	// ("transformer.h.3.attn.c_attn.weight"), used in checkpoints and exports.
	Name string
	// Shape is row-major, weights (out, in) like nn.Linear.
	Shape []int
	// Offset is the element offset of the tensor in the layer's block (the
	// same for the compute-dtype weights, fp32 master, grads and Adam m/v).
	Offset int
	// Decay is true for 2-D weights (matrices and embeddings), the tensors
	// AdamW applies weight decay to; norms and biases are not decayed.
	Decay bool
	// Init and Std give the initialisation (Std for InitNormal only).
	Init Init
	Std  float64
}

// Elems is the number of elements of the tensor.
func (p ParamSpec) Elems() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

// specBuilder lays out a layer's parameters back to back.
type specBuilder struct {
	specs []ParamSpec
	n     int
}

func (b *specBuilder) add(name string, init Init, std float64, shape ...int) ParamSpec {
	p := ParamSpec{Name: name, Shape: shape, Offset: b.n, Decay: len(shape) >= 2, Init: init, Std: std}
	b.specs = append(b.specs, p)
	b.n += p.Elems()
	return p
}

// rng is a small deterministic generator (splitmix64) for initialisation.
// Each tensor gets its own stream keyed by (seed, name), so a tensor's
// initial values do not depend on the order layers are built or on which
// layers are resident.
type rng struct{ s uint64 }

func newTensorRNG(seed uint64, name string) *rng {
	h := fnv.New64a()
	h.Write([]byte(name))
	return &rng{s: seed ^ h.Sum64()*0x9e3779b97f4a7c15}
}

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// float64 in (0, 1].
func (r *rng) unit() float64 { return (float64(r.next()>>11) + 1) / (1 << 53) }

// fillNormal writes N(0, std²) values (Box-Muller) into dst.
func (r *rng) fillNormal(dst []float32, std float64) {
	for i := 0; i < len(dst); i += 2 {
		u1, u2 := r.unit(), r.unit()
		rad := math.Sqrt(-2 * math.Log(u1))
		dst[i] = float32(std * rad * math.Cos(2*math.Pi*u2))
		if i+1 < len(dst) {
			dst[i+1] = float32(std * rad * math.Sin(2*math.Pi*u2))
		}
	}
}

// initGrain is the number of elements of a normal tensor one goroutine
// fills at a time (even: a chunk starts on a Box-Muller pair).
const initGrain = 1 << 16

// at returns the generator positioned after k draws of r: splitmix64's
// state after k draws is the seed plus k times the increment.
func (r rng) at(k int) rng { return rng{s: r.s + uint64(k)*0x9e3779b97f4a7c15} }

// InitParams fills dst (the fp32 values of one layer's whole block, laid
// out by specs) deterministically from seed.
//
// Normal tensors are filled in chunks of initGrain elements on up to
// GOMAXPROCS goroutines. Each element pair (2j, 2j+1) of a tensor takes
// draws 2j and 2j+1 of the tensor's stream, so a chunk starting at an even
// element i starts the stream at draw i (rng.at) and the values are those
// of one serial pass over the tensor, bit for bit, whatever the split.
func InitParams(dst []float32, specs []ParamSpec, seed uint64) {
	type chunk struct {
		t   []float32
		r   rng // copied by the goroutine that fills t: generators on one cache line would be falsely shared
		std float64
	}
	var work []chunk
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
			r := newTensorRNG(seed, p.Name)
			for lo := 0; lo < len(t); lo += initGrain {
				work = append(work, chunk{t[lo:min(lo+initGrain, len(t))], r.at(lo), p.Std})
			}
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(work))
	if workers <= 1 {
		for _, c := range work {
			c.r.fillNormal(c.t, c.std)
		}
		return
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(work) {
					return
				}
				c := work[i]
				c.r.fillNormal(c.t, c.std)
			}
		}()
	}
	wg.Wait()
}
