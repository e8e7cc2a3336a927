package offload

import (
	"fmt"
	"strings"

	"github.com/spill-ml/spill/kernels"
)

// MemorySummary renders the statistics as a text table, one row per tensor
// class with its allocated, peak and reserved bytes and its block counts,
// followed by the totals, the cache's free memory and fragmentation and the
// allocator's event counts.
func (s CacheStats) MemorySummary() string {
	var b strings.Builder
	line := strings.Repeat("=", 78) + "\n"
	thin := strings.Repeat("-", 78) + "\n"
	b.WriteString(line)
	limit := "none"
	if s.Limit > 0 {
		limit = kernels.FormatBytes(s.Limit)
	}
	src := s.Source
	if src == "" {
		src = "offload device cache"
	}
	fmt.Fprintf(&b, " %s memory summary (budget %s)\n", src, limit)
	b.WriteString(line)
	fmt.Fprintf(&b, " %-12s %12s %12s %12s %8s %9s %8s\n", "class", "allocated", "peak", "reserved", "blocks", "allocs", "frees")
	b.WriteString(thin)
	for i, cs := range s.ByClass {
		if cs.Allocs == 0 && cs.Reserved == 0 {
			continue
		}
		fmt.Fprintf(&b, " %-12s %12s %12s %12s %8d %9d %8d\n", Class(i),
			kernels.FormatBytes(cs.Allocated), kernels.FormatBytes(cs.Peak), kernels.FormatBytes(cs.Reserved),
			cs.Blocks, cs.Allocs, cs.Frees)
	}
	b.WriteString(thin)
	fmt.Fprintf(&b, " %-12s %12s %12s %12s %8d %9d %8d\n", "total",
		kernels.FormatBytes(s.Allocated), kernels.FormatBytes(s.PeakAllocated), kernels.FormatBytes(s.Reserved),
		s.Blocks, s.Allocs, s.Frees)
	fmt.Fprintf(&b, " %-12s %12s %12s %12s\n", "peak reserved", "", "", kernels.FormatBytes(s.PeakReserved))
	b.WriteString(thin)
	fmt.Fprintf(&b, " requested by live blocks %s (rounding %s)\n",
		kernels.FormatBytes(s.Requested), kernels.FormatBytes(s.Allocated-s.Requested))
	fmt.Fprintf(&b, " cached free %s in %d blocks, largest %s, fragmentation %.1f%%\n",
		kernels.FormatBytes(s.FreeBytes), s.FreeBlocks, kernels.FormatBytes(s.LargestFree), 100*s.Fragmentation)
	fmt.Fprintf(&b, " segments %d (allocated %d, released %d), cache hits %d, splits %d, merges %d, budget failures %d\n",
		s.Segments, s.SegmentAllocs, s.SegmentFrees, s.CacheHits, s.Splits, s.Merges, s.BudgetFailures)
	b.WriteString(line)
	return b.String()
}

// MemorySummary is c.Stats().MemorySummary().
func (c *Cache) MemorySummary() string { return c.Stats().MemorySummary() }
