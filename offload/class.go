// Package offload decides and records where every tensor of a model lives
// while it trains out of core: on the device, in pinned host memory or in
// files on local disk.
//
// It has four parts, each usable on its own:
//
//   - Cache, a caching allocator over a backend's raw device allocations
//     (size classes, block splitting and coalescing inside segments, a hard
//     budget, statistics and MemorySummary);
//   - HostPool, pinned host buffers under a byte budget, which degrades to a
//     small ring of staging buffers when the process may not lock that much;
//   - Disk, tensors in memory-mapped files read and written by a bounded
//     set of asynchronous workers;
//   - Table, the one residency table saying which tier holds a valid copy of
//     every tensor, with its transitions validated;
//
// and the planner, Plan, which from a model's shape, the tier budgets and a
// hardware profile chooses a placement and predicts peak memory and step
// time. Nothing in this package holds state on kernels.Tensor values.
package offload

import "fmt"

// Class is the kind of a tensor as far as placement is concerned. Every
// tensor the trainer allocates belongs to exactly one class; budgets,
// statistics and errors are broken down by class.
type Class uint8

// Tensor classes.
const (
	Weights     Class = iota // parameters in the compute dtype
	Grads                    // parameter gradients
	Master                   // fp32 master copy of the parameters (mixed precision)
	AdamM                    // Adam first moment (fp32)
	AdamV                    // Adam second moment (fp32)
	Activations              // saved forward activations
	Workspace                // scratch: logits, staging, residual stream
	numClasses
	// NumClasses is the number of classes, for arrays indexed by Class.
	NumClasses = numClasses
)

var classNames = [numClasses]string{"weights", "grads", "master", "adam_m", "adam_v", "activations", "workspace"}

// Classes lists every class in order.
func Classes() []Class {
	cs := make([]Class, numClasses)
	for i := range cs {
		cs[i] = Class(i)
	}
	return cs
}

func (c Class) String() string {
	if c < numClasses {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", c)
}

// ParseClass parses a class name as printed by String.
func ParseClass(s string) (Class, error) {
	for i, n := range classNames {
		if n == s {
			return Class(i), nil
		}
	}
	return 0, fmt.Errorf("offload: unknown tensor class %q (want one of %v)", s, classNames)
}

// Tier is a level of the memory hierarchy.
type Tier uint8

// Tiers, fastest first. TierNone means "not materialised anywhere".
const (
	TierNone Tier = iota
	TierDevice
	TierHost
	TierDisk
	numTiers
)

var tierNames = [numTiers]string{"none", "device", "host", "disk"}

func (t Tier) String() string {
	if t < numTiers {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", t)
}

// MarshalText makes tiers print by name in JSON.
func (t Tier) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// MarshalText makes classes print by name in JSON.
func (c Class) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText parses a tier name.
func (t *Tier) UnmarshalText(b []byte) error {
	for i, n := range tierNames {
		if n == string(b) {
			*t = Tier(i)
			return nil
		}
	}
	return fmt.Errorf("offload: unknown tier %q", b)
}

// UnmarshalText parses a class name.
func (c *Class) UnmarshalText(b []byte) error {
	v, err := ParseClass(string(b))
	*c = v
	return err
}
