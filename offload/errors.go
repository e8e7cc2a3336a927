package offload

import (
	"fmt"
	"strings"

	"github.com/spill-ml/spill/kernels"
)

// ErrBudget is wrapped by every error this package returns because a tier's
// budget would be exceeded. It wraps kernels.ErrOutOfMemory, so callers that
// only know the kernels package still recognise it.
var ErrBudget = fmt.Errorf("offload: budget exceeded: %w", kernels.ErrOutOfMemory)

// BudgetError reports a request that does not fit a tier's budget: what was
// asked for, what was held at the time and by which tensor class, and, when
// a planner hint is available, which plan would fit.
type BudgetError struct {
	Tier      Tier
	Class     Class // class of the refused request
	Requested int64 // bytes asked for
	Limit     int64 // the budget
	Reserved  int64 // bytes taken from the tier (allocated plus cached)
	Allocated int64 // bytes handed out and not yet freed
	// ByClass is the bytes allocated per class at the time.
	ByClass map[Class]int64
	// LargestFree is the largest cached free block, which was too small.
	LargestFree int64
	// Hint is a suggestion from the planner ("plan: weights on host, ..."), or "".
	Hint string
	// Cause is the lower layer's error when it refused (the backend's own
	// out-of-memory error), or nil when this package's budget refused.
	Cause error
}

func (e *BudgetError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "offload: %s budget exceeded: %s for %s does not fit: %s of %s reserved, %s allocated",
		e.Tier, kernels.FormatBytes(e.Requested), e.Class,
		kernels.FormatBytes(e.Reserved), kernels.FormatBytes(e.Limit), kernels.FormatBytes(e.Allocated))
	first := true
	for _, c := range Classes() {
		n := e.ByClass[c]
		if n == 0 {
			continue
		}
		if first {
			b.WriteString(" (")
			first = false
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", c, kernels.FormatBytes(n))
	}
	if !first {
		b.WriteString(")")
	}
	if free := e.Reserved - e.Allocated; free > 0 {
		fmt.Fprintf(&b, "; %s cached free, largest block %s", kernels.FormatBytes(free), kernels.FormatBytes(e.LargestFree))
	}
	if e.Cause != nil {
		fmt.Fprintf(&b, "; %v", e.Cause)
	}
	if e.Hint != "" {
		fmt.Fprintf(&b, "; %s", e.Hint)
	}
	return b.String()
}

// Unwrap returns ErrBudget and, if set, the lower layer's error.
func (e *BudgetError) Unwrap() []error {
	if e.Cause != nil {
		return []error{ErrBudget, e.Cause}
	}
	return []error{ErrBudget}
}
