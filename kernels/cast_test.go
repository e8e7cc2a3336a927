package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func isNaN32(f float32) bool { return f != f }

// refRound rounds the float64 value of f to a 16-bit format described by
// its positive finite patterns (monotonic in value) and its overflow
// threshold, independently of the bit tricks in cast.go: nearest value,
// ties to the even pattern.
type refFormat struct {
	name     string
	toF64    func(uint16) float64 // exact value of a pattern
	maxFin   uint16               // largest finite positive pattern
	overflow float64              // |x| >= overflow rounds to Inf
	inf      uint16
}

func (r refFormat) round(f float32) uint16 {
	v := float64(f)
	var sign uint16
	if math.Signbit(v) {
		sign = 0x8000
		v = -v
	}
	if v >= r.overflow {
		return sign | r.inf
	}
	// largest pattern with value <= v
	lo := uint16(sort.Search(int(r.maxFin)+1, func(i int) bool { return r.toF64(uint16(i)) > v }) - 1)
	if lo == r.maxFin {
		return sign | lo // below the overflow threshold: rounds down to max
	}
	a, b := r.toF64(lo), r.toF64(lo+1)
	switch {
	case v-a < b-v:
		return sign | lo
	case v-a > b-v:
		return sign | (lo + 1)
	case lo&1 == 0:
		return sign | lo
	}
	return sign | (lo + 1)
}

func f16Value(h uint16) float64 {
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	if e == 0 {
		return m * math.Ldexp(1, -24)
	}
	return (1 + m/1024) * math.Ldexp(1, e-15)
}

func bf16Value(h uint16) float64 {
	e := int(h>>7) & 0xff
	m := float64(h & 0x7f)
	if e == 0 {
		return m * math.Ldexp(1, -133)
	}
	return (1 + m/128) * math.Ldexp(1, e-127)
}

var (
	refF16  = refFormat{"f16", f16Value, 0x7bff, 65520, 0x7c00}
	refBF16 = refFormat{"bf16", bf16Value, 0x7f7f, (2 - 1.0/256) * math.Ldexp(1, 127), 0x7f80}
)

func TestF16RoundTripAllPatterns(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := F32FromF16(h)
		e, m := (h>>10)&0x1f, h&0x3ff
		if e == 0x1f && m != 0 {
			if !isNaN32(f) {
				t.Fatalf("F32FromF16(%#04x) = %v, want NaN", h, f)
			}
			if got, want := F16FromF32(f), h|0x0200; got != want {
				t.Fatalf("NaN %#04x round-trips to %#04x, want quieted %#04x", h, got, want)
			}
			continue
		}
		if got := F16FromF32(f); got != h {
			t.Fatalf("F16 %#04x -> %v -> %#04x", h, f, got)
		}
		if e != 0x1f {
			v := f16Value(h)
			if h&0x8000 != 0 {
				v = -v
			}
			if float64(f) != v {
				t.Fatalf("F32FromF16(%#04x) = %v, want %v", h, f, v)
			}
		}
	}
}

func TestBF16RoundTripAllPatterns(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := F32FromBF16(h)
		e, m := (h>>7)&0xff, h&0x7f
		if e == 0xff && m != 0 {
			if !isNaN32(f) {
				t.Fatalf("F32FromBF16(%#04x) = %v, want NaN", h, f)
			}
			if got, want := BF16FromF32(f), h|0x0040; got != want {
				t.Fatalf("NaN %#04x round-trips to %#04x, want quieted %#04x", h, got, want)
			}
			continue
		}
		if got := BF16FromF32(f); got != h {
			t.Fatalf("BF16 %#04x -> %v -> %#04x", h, f, got)
		}
		if e != 0xff {
			v := bf16Value(h)
			if h&0x8000 != 0 {
				v = -v
			}
			if float64(f) != v {
				t.Fatalf("F32FromBF16(%#04x) = %v, want %v", h, f, v)
			}
		}
	}
}

// edgeFloats are float32 values at and around every rounding boundary of
// the format: each representable value, the midpoints between neighbours
// and the float32 values just either side of them.
func edgeFloats(toF32 func(uint16) float32) []float32 {
	var out []float32
	for i := 0; i < 0x7fff; i++ {
		a := toF32(uint16(i))
		b := toF32(uint16(i + 1))
		if isNaN32(a) || isNaN32(b) || math.IsInf(float64(a), 0) {
			continue
		}
		mid := float32((float64(a) + float64(b)) / 2) // exact in float32
		for _, x := range []float32{a, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1)))} {
			out = append(out, x, -x)
		}
	}
	out = append(out, 0, float32(math.Copysign(0, -1)), math.MaxFloat32, -math.MaxFloat32,
		math.SmallestNonzeroFloat32, 65504, 65519.996, 65520, 65536, 1e-8, 5.9604645e-08, 2.9802322e-08, 2.9802326e-08)
	return out
}

func randomFloats(n int) []float32 {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]float32, n)
	for i := range out {
		if i%2 == 0 {
			out[i] = math.Float32frombits(r.Uint32()) // every exponent alike
		} else {
			out[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(12)-8)))
		}
	}
	return out
}

func checkAgainstRef(t *testing.T, ref refFormat, conv func(float32) uint16, xs []float32) {
	t.Helper()
	bad := 0
	for _, x := range xs {
		got := conv(x)
		if isNaN32(x) {
			if e, m := got&0x7fff, got; !(ref.name == "f16" && e > 0x7c00 || ref.name == "bf16" && e > 0x7f80) {
				t.Fatalf("%s(%v) = %#04x, want NaN", ref.name, x, m)
			}
			continue
		}
		if want := ref.round(x); got != want {
			bad++
			if bad < 10 {
				t.Errorf("%s(%v = %#08x) = %#04x, want %#04x", ref.name, x, math.Float32bits(x), got, want)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d values wrong", bad, len(xs))
	}
}

func TestF16FromF32AgainstFloat64(t *testing.T) {
	xs := append(edgeFloats(F32FromF16), randomFloats(100000)...)
	checkAgainstRef(t, refF16, F16FromF32, xs)
}

func TestBF16FromF32AgainstFloat64(t *testing.T) {
	xs := append(edgeFloats(F32FromBF16), randomFloats(100000)...)
	checkAgainstRef(t, refBF16, BF16FromF32, xs)
}

func TestSpecialValues(t *testing.T) {
	inf := float32(math.Inf(1))
	cases := []struct {
		f         float32
		f16, bf16 uint16
	}{
		{inf, 0x7c00, 0x7f80},
		{-inf, 0xfc00, 0xff80},
		{65504, 0x7bff, 0x4780},           // bf16 has 8 bits: rounds up to 65536
		{65520, 0x7c00, 0x4780},           // f16 tie between max and 2^16 rounds to even: Inf
		{1e6, 0x7c00, 0x4974},             // f16 overflow
		{math.MaxFloat32, 0x7c00, 0x7f80}, // bf16 rounds up to Inf
		{5.9604645e-08, 0x0001, 0x3380},   // smallest f16 subnormal
		{2.9802322e-08, 0x0000, 0x3300},   // exactly half of it: tie to even (0)
		{float32(math.Copysign(0, -1)), 0x8000, 0x8000},
	}
	for _, c := range cases {
		if got := F16FromF32(c.f); got != c.f16 {
			t.Errorf("F16FromF32(%v) = %#04x, want %#04x", c.f, got, c.f16)
		}
		if got := BF16FromF32(c.f); got != c.bf16 {
			t.Errorf("BF16FromF32(%v) = %#04x, want %#04x", c.f, got, c.bf16)
		}
	}
	// A signaling float32 NaN becomes a quiet NaN of the same sign.
	snan := math.Float32frombits(0xff800001)
	if h := F16FromF32(snan); h&0xfe00 != 0xfe00 {
		t.Errorf("F16FromF32(sNaN) = %#04x, want negative quiet NaN", h)
	}
	if h := BF16FromF32(snan); h&0xffc0 != 0xffc0 {
		t.Errorf("BF16FromF32(sNaN) = %#04x, want negative quiet NaN", h)
	}
}

func TestSliceAndBytesConversions(t *testing.T) {
	xs := randomFloats(1000)
	b16 := make([]uint16, len(xs))
	h16 := make([]uint16, len(xs))
	BF16FromF32s(b16, xs)
	F16FromF32s(h16, xs)
	back := make([]float32, len(xs))
	F32FromBF16s(back, b16)
	for i := range xs {
		if b16[i] != BF16FromF32(xs[i]) || math.Float32bits(back[i]) != math.Float32bits(F32FromBF16(b16[i])) {
			t.Fatalf("bf16 slice mismatch at %d", i)
		}
	}
	F32FromF16s(back, h16)
	for i := range xs {
		if h16[i] != F16FromF32(xs[i]) || math.Float32bits(back[i]) != math.Float32bits(F32FromF16(h16[i])) {
			t.Fatalf("f16 slice mismatch at %d", i)
		}
	}
	src := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(x))
	}
	dst := make([]byte, 2*len(xs))
	ConvertBytes(dst, BF16, src, F32)
	for i := range xs {
		if binary.LittleEndian.Uint16(dst[2*i:]) != b16[i] {
			t.Fatalf("ConvertBytes f32->bf16 mismatch at %d", i)
		}
	}
	f16b := make([]byte, 2*len(xs))
	ConvertBytes(f16b, F16, dst, BF16)
	for i := range xs {
		if got, want := binary.LittleEndian.Uint16(f16b[2*i:]), F16FromBF16(b16[i]); got != want {
			t.Fatalf("ConvertBytes bf16->f16 at %d: %#04x want %#04x", i, got, want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("ConvertBytes with mismatched sizes did not panic")
		}
	}()
	ConvertBytes(make([]byte, 3), F16, src, F32)
}
