// spill's one parser and formatter of byte counts. Every
// flag and config key that takes a size (train --device-memory, plan
// --device-memory, convert --shard-size, ...) goes through ParseBytes, so the same
// text means the same number everywhere, and every size spill prints goes
// through FormatBytes.
//
// Units, case-insensitive, with or without a space after the number:
//
//	B                   1
//	KiB MiB GiB TiB PiB powers of 1024
//	K   M   G   T   P   powers of 1024 too (16G = 16 GiB = 17179869184)
//	KB  MB  GB  TB  PB  powers of 1000 (16GB = 16000000000)
//
// A bare letter is binary because memory is sized in powers of two: a
// "16G" GPU or host holds 16 GiB.
package kernels

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var units = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "tib": 1 << 40, "tb": 1e12,
	"p": 1 << 50, "pib": 1 << 50, "pb": 1e15,
}

// ParseBytes parses a non-negative byte count such as "1048576", "512MiB",
// "1.5 GB" or "16g" (see the package comment for the units). A fraction
// is rounded down to a whole byte.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := units[unit]
	if !ok || num == "" || strings.Trim(num, "0123456789.") != "" {
		return 0, fmt.Errorf("bad byte size %q: want a number with an optional unit (B, KiB, MiB, GiB, TiB; K, M, G, T are the same; KB, MB, GB, TB are powers of 1000)", s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("bad byte size %q: want a non-negative number with an optional unit", s)
	}
	if unit == "" || unit == "b" {
		// Whole bytes: parse exactly (a float64 loses precision above 2^53).
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bad byte size %q: want a whole number of bytes, or a unit", s)
		}
		return n, nil
	}
	v := math.Floor(f * mult)
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("bad byte size %q: too large", s)
	}
	return int64(v), nil
}

// FormatBytes renders n with a binary unit and one decimal: "512 B",
// "1.5 KiB", "64.0 MiB", "-2.0 GiB". Parse reads it back to within the
// rounding of the decimal.
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; (m >= unit || m <= -unit) && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
