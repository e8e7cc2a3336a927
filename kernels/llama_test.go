package kernels

import (
	"math"
	"strings"
	"testing"
)

// llama32 is the rope configuration of Llama 3.2 1B and 3B.
var llama32 = RoPEConfig{Theta: 500000, Scaling: RoPEScaling{Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}}

// llama3Freq is the llama3 frequency of pair i worked out from the
// formula as transformers states it, in wavelengths: keep the frequency
// of wavelengths under orig/high, divide it by factor over orig/low, and
// in between mix the two with weight (orig/wavelength - low)/(high - low)
// on the unscaled one. band is which case applied.
func llama3Freq(c RoPEConfig, hs, i int) (f float64, band string) {
	s := c.Scaling
	base := 1 / math.Pow(c.Theta, float64(2*i)/float64(hs))
	wavelen := 2 * math.Pi / base
	orig := float64(s.OriginalMaxPositions)
	switch {
	case wavelen < orig/s.HighFreqFactor:
		return base, "high"
	case wavelen > orig/s.LowFreqFactor:
		return base / s.Factor, "low"
	}
	smooth := (orig/wavelen - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
	return (1-smooth)*base/s.Factor + smooth*base, "medium"
}

func TestRoPELlama3Frequencies(t *testing.T) {
	const hs = 128
	got := llama32.InvFreq(hs)
	// With theta 500000 and 64 pairs, pair i has wavelength
	// 2π·500000^(i/64): pairs up to 28 are under 2048 positions (kept),
	// 29 to 34 between 2048 and 8192 (blended), 35 on over 8192 (÷32).
	bands := map[int]string{0: "high", 1: "high", 28: "high", 29: "medium", 30: "medium", 34: "medium", 35: "low", 50: "low", 63: "low"}
	for i, wantBand := range bands {
		want, band := llama3Freq(llama32, hs, i)
		if band != wantBand {
			t.Fatalf("pair %d is in the %s band by the formula, the test expects %s", i, band, wantBand)
		}
		if math.Abs(got[i]-want) > 1e-12*want {
			t.Errorf("pair %d (%s band): frequency %v, want %v", i, band, got[i], want)
		}
		unscaled := math.Pow(500000, -float64(2*i)/hs)
		switch band {
		case "high":
			if got[i] != unscaled {
				t.Errorf("pair %d: high-frequency pair changed: %v, want %v", i, got[i], unscaled)
			}
		case "medium":
			if !(got[i] > unscaled/32 && got[i] < unscaled) {
				t.Errorf("pair %d: blended frequency %v not strictly between %v and %v", i, got[i], unscaled/32, unscaled)
			}
		}
	}
	// Pair 63, the lowest frequency, worked out by hand:
	// 500000^(-126/128) / 32 = exp(-126/128·ln 500000) / 32.
	if want := math.Exp(-126.0/128*math.Log(500000)) / 32; math.Abs(got[63]-want) > 1e-15 {
		t.Errorf("pair 63: %v, want %v", got[63], want)
	}
}

func TestRoPETable(t *testing.T) {
	const hs = 128
	const half = hs / 2
	positions := []int{0, 1, 7, 1000, 8191, 20000}
	T := positions[len(positions)-1] + 1
	for _, c := range []struct {
		name string
		cfg  RoPEConfig
		freq func(i int) float64
	}{
		{"llama3.2", llama32, func(i int) float64 { f, _ := llama3Freq(llama32, hs, i); return f }},
		{"llama2", RoPEConfig{Theta: 10000}, func(i int) float64 { return math.Pow(10000, -float64(2*i)/hs) }},
	} {
		tab := c.cfg.Table(T, hs)
		if len(tab) != T*hs {
			t.Fatalf("%s: table of %d values, want %d", c.name, len(tab), T*hs)
		}
		for _, p := range positions {
			row := tab[p*hs : p*hs+hs]
			for _, i := range []int{0, 5, 29, 31, 40, 63} {
				f := c.freq(i)
				// The angle as the table promises it: frequency and
				// position in float32, product rounded to float32.
				a := float64(float32(p) * float32(f))
				if gc, gs := float64(row[i]), float64(row[half+i]); math.Abs(gc-math.Cos(a)) > 1e-7 || math.Abs(gs-math.Sin(a)) > 1e-7 {
					t.Errorf("%s: position %d pair %d: cos, sin = %v, %v; want %v, %v", c.name, p, i, gc, gs, math.Cos(a), math.Sin(a))
				}
				// And close to the exact angle while it is small.
				if exact := float64(p) * f; exact < 1000 && math.Abs(float64(row[i])-math.Cos(exact)) > 1e-4 {
					t.Errorf("%s: position %d pair %d: cos %v, exact %v", c.name, p, i, row[i], math.Cos(exact))
				}
			}
			if p == 0 {
				for i := 0; i < half; i++ {
					if row[i] != 1 || row[half+i] != 0 {
						t.Fatalf("%s: position 0 pair %d: cos, sin = %v, %v; want exactly 1, 0", c.name, i, row[i], row[half+i])
					}
				}
			}
		}
	}
}

func TestRoPEConfigValidate(t *testing.T) {
	if err := llama32.Validate(64); err != nil {
		t.Fatalf("llama 3.2 rope: %v", err)
	}
	bad := RoPEConfig{Theta: 0, Scaling: RoPEScaling{Factor: 0.5, LowFreqFactor: 4, HighFreqFactor: 4}}
	err := bad.Validate(7)
	if err == nil {
		t.Fatal("invalid rope configuration accepted")
	}
	for _, want := range []string{"head size 7", "theta 0", "factor 0.5", "high_freq_factor 4 must exceed low_freq_factor 4", "original_max_position_embeddings 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not report %q", err, want)
		}
	}
}
