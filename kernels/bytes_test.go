package kernels

import (
	"math"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "1048576": 1 << 20, "12 B": 12, "12b": 12,
		"16G": 16 << 30, "16g": 16 << 30, "16GiB": 16 << 30, "16gib": 16 << 30, "16 GiB": 16 << 30,
		"16GB": 16e9, "16gb": 16e9, "1.5KiB": 1536, "1.5k": 1536, "512MiB": 512 << 20, "64m": 64 << 20,
		"1TB": 1e12, "1T": 1 << 40, "2PiB": 2 << 50, "1.5GB": 1.5e9, " 7 ": 7,
		"9223372036854775807": math.MaxInt64,
	} {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1", "-1GiB", "1.2.3", "12 parsecs", "1e3", "1.5", "2.5B", "NaN", "1x", "10000PB", "99999999999999999999"} {
		if got, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", in, got)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", -5: "-5 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 512 << 20: "512.0 MiB",
		16 << 30: "16.0 GiB", -(3 << 30): "-3.0 GiB", 1 << 40: "1.0 TiB", math.MaxInt64: "8.0 EiB",
	} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestRoundTrip: what Format prints, Parse reads back within the rounding
// of one decimal.
func TestBytesRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1000, 1 << 20, 3<<30 + 12345, 5 << 40} {
		got, err := ParseBytes(FormatBytes(n))
		if err != nil {
			t.Fatal(err)
		}
		if d := math.Abs(float64(got - n)); d > 0.05*float64(n)+1 {
			t.Errorf("ParseBytes(FormatBytes(%d)) = %d", n, got)
		}
	}
}
