package offload

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseBytes parses a size such as "80GiB", "512MiB", "1.5TB", "64G" or
// "1048576". Binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB)
// units are accepted; a bare K, M, G or T is binary.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("offload: bad size %q (want e.g. 80GiB, 512MiB, 1TB)", s)
	}
	mult := map[string]float64{
		"": 1, "B": 1,
		"K": 1 << 10, "KiB": 1 << 10, "KB": 1e3,
		"M": 1 << 20, "MiB": 1 << 20, "MB": 1e6,
		"G": 1 << 30, "GiB": 1 << 30, "GB": 1e9,
		"T": 1 << 40, "TiB": 1 << 40, "TB": 1e12,
	}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("offload: bad size %q: unknown unit %q", s, unit)
	}
	return int64(v * mult), nil
}
