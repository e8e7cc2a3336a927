package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestConvertSlices: the dispatched slice conversions (vector kernels
// where the CPU has them) give the bits of the scalar reference loops:
// widening for every 16-bit pattern, rounding for every top half of a
// float32 combined with the low halves that decide the rounding of both
// formats (ties, either side of them, sticky bits), plus random bits. The
// lengths are not multiples of 8, so the scalar tails run too.
func TestConvertSlices(t *testing.T) {
	src16 := make([]uint16, 1<<16+5)
	for i := range src16 {
		src16[i] = uint16(i)
	}
	for _, c := range []struct {
		name      string
		got, want func([]float32, []uint16)
	}{{"bf16->f32", bf16ToF32, bf16ToF32Go}, {"f16->f32", f16ToF32, f16ToF32Go}} {
		got, want := make([]float32, len(src16)), make([]float32, len(src16))
		c.got(got, src16)
		c.want(want, src16)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s(%#04x) = %#08x, want %#08x", c.name, src16[i], math.Float32bits(got[i]), math.Float32bits(want[i]))
			}
		}
	}

	var lows []uint32
	for b := uint32(0); b < 16; b++ {
		for _, l := range []uint32{0, 1, 0x7ff, 0x800, 0x801, 0xffe, 0xfff} {
			lows = append(lows, b<<12|l)
		}
	}
	src := make([]float32, 0, 1<<16*len(lows)+1<<20+3)
	for hi := uint32(0); hi < 1<<16; hi++ {
		for _, lo := range lows {
			src = append(src, math.Float32frombits(hi<<16|lo))
		}
	}
	r := rand.New(rand.NewPCG(9, 10))
	for range 1<<20 + 3 {
		src = append(src, math.Float32frombits(r.Uint32()))
	}
	for _, c := range []struct {
		name      string
		got, want func([]uint16, []float32)
	}{{"f32->bf16", f32ToBF16, f32ToBF16Go}, {"f32->f16", f32ToF16, f32ToF16Go}} {
		got, want := make([]uint16, len(src)), make([]uint16, len(src))
		c.got(got, src)
		c.want(want, src)
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s(%#08x) = %#04x, want %#04x", c.name, math.Float32bits(src[i]), got[i], want[i])
			}
		}
	}
	// Every length from 0 to 40 at an odd offset: the split between the
	// vector body and the scalar tail.
	for n := 0; n <= 40; n++ {
		d := make([]uint16, n+2)
		f32ToBF16(d[1:n+1], src[3:3+n])
		for i := 0; i < n; i++ {
			var w [1]uint16
			f32ToBF16Go(w[:], src[3+i:4+i])
			if d[1+i] != w[0] {
				t.Fatalf("length %d: element %d = %#04x, want %#04x", n, i, d[1+i], w[0])
			}
		}
		if d[0] != 0 || d[n+1] != 0 {
			t.Fatalf("length %d: wrote outside the destination", n)
		}
	}
}

// BenchmarkConvert: the slice conversions on 4096 elements (L1-resident),
// vector (as dispatched) and scalar.
func BenchmarkConvert(b *testing.B) {
	const n = 4096
	f, h := make([]float32, n), make([]uint16, n)
	for i := range f {
		f[i] = float32(i) * 0.37
	}
	for _, c := range []struct {
		name string
		fn   func()
	}{
		{"bf16->f32", func() { bf16ToF32(f, h) }}, {"bf16->f32/go", func() { bf16ToF32Go(f, h) }},
		{"f32->bf16", func() { f32ToBF16(h, f) }}, {"f32->bf16/go", func() { f32ToBF16Go(h, f) }},
		{"f16->f32", func() { f16ToF32(f, h) }}, {"f16->f32/go", func() { f16ToF32Go(f, h) }},
		{"f32->f16", func() { f32ToF16(h, f) }}, {"f32->f16/go", func() { f32ToF16Go(h, f) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(6 * n)
			for range b.N {
				c.fn()
			}
		})
	}
}
