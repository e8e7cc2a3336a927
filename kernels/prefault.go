package kernels

import "github.com/spill-ml/spill/kernels/internal/memclr"

// Prefault faults in every page of b on all cores, by writing a zero to
// each: b must read as zero (fresh anonymous memory) and stays so. Host
// memory that a run will stream through anyway (an out-of-core trainer's
// optimizer state) is then faulted in at start-up, in parallel, instead of
// one page at a time by its first user.
func Prefault(b []byte) { memclr.Fault(b) }
