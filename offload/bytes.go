package offload

import (
	"fmt"

	"github.com/spill-ml/spill/internal/bytesize"
)

// ParseBytes parses a size such as "80GiB", "512MiB", "1.5TB", "64G" or
// "1048576" with spill's one byte-size parser (internal/bytesize): units
// are case-insensitive, KiB/MiB/GiB/TiB and a bare K/M/G/T are powers of
// 1024, KB/MB/GB/TB powers of 1000.
func ParseBytes(s string) (int64, error) {
	n, err := bytesize.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("offload: %w", err)
	}
	return n, nil
}
