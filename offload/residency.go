package offload

import (
	"fmt"
	"sort"
	"sync"
)

// Key names one tensor of the model: a class of one layer. Layer numbers
// are the planner's (0 the embedding, 1..L the blocks, L+1 the head); a
// layer's tensors of one class are one unit of placement.
type Key struct {
	Layer int
	Class Class
	// Part tells apart tensors of one class of one layer: for
	// Activations, PartCheckpoint is the output a recomputed layer keeps
	// (its full activations are part 0). Zero for every other class.
	Part uint8
	// MB is the micro-batch of activations: a layer-major schedule holds
	// several micro-batches' activations of one layer at once. Zero for
	// every other class.
	MB int
}

// PartCheckpoint is the Part of a recomputed layer's checkpoint.
const PartCheckpoint uint8 = 1

func (k Key) String() string {
	if k.MB != 0 {
		return fmt.Sprintf("%s of micro-batch %d", Key{Layer: k.Layer, Class: k.Class, Part: k.Part}, k.MB)
	}
	if k.Part == PartCheckpoint && k.Class == Activations {
		return fmt.Sprintf("layer %d checkpoint", k.Layer)
	}
	if k.Part != 0 {
		return fmt.Sprintf("layer %d %s part %d", k.Layer, k.Class, k.Part)
	}
	return fmt.Sprintf("layer %d %s", k.Layer, k.Class)
}

// FileName is the name of k's file in the disk tier.
func (k Key) FileName() string {
	if k.Part != 0 {
		return fmt.Sprintf("l%04d-%s-p%d.bin", k.Layer, k.Class, k.Part)
	}
	return fmt.Sprintf("l%04d-%s.bin", k.Layer, k.Class)
}

// TierSet is a set of tiers.
type TierSet uint8

// Has reports whether t is in s.
func (s TierSet) Has(t Tier) bool { return s&(1<<t) != 0 }

func (s TierSet) with(t Tier) TierSet    { return s | 1<<t }
func (s TierSet) without(t Tier) TierSet { return s &^ (1 << t) }

func (s TierSet) String() string {
	out := ""
	for t := TierDevice; t < numTiers; t++ {
		if s.Has(t) {
			if out != "" {
				out += "+"
			}
			out += t.String()
		}
	}
	if out == "" {
		return "none"
	}
	return out
}

// Move is a copy in flight between two tiers.
type Move struct{ From, To Tier }

// Residency is what the Table knows of one tensor.
type Residency struct {
	Key   Key
	Bytes int64
	// Valid is the set of tiers holding an up-to-date copy.
	Valid TierSet
	// Moving is the copy in flight, if InFlight.
	Moving   Move
	InFlight bool
}

// TransitionError is an invalid residency transition.
type TransitionError struct {
	Key    Key
	Op     string
	State  Residency
	Reason string
}

func (e *TransitionError) Error() string {
	s := fmt.Sprintf("offload: residency: %s of %s: %s (valid on %s", e.Op, e.Key, e.Reason, e.State.Valid)
	if e.State.InFlight {
		s += fmt.Sprintf(", copy %s->%s in flight", e.State.Moving.From, e.State.Moving.To)
	}
	return s + ")"
}

// Table records where every tensor lives. A tensor may have valid copies
// in several tiers at once (weights on the host and a prefetched copy on the
// device). The transitions, each validated:
//
//   - Add: a new tensor, valid on one tier.
//   - BeginCopy / EndCopy (or AbortCopy): copy between adjacent tiers
//     (device<->host, host<->disk), at most one copy of a tensor in flight;
//     the destination becomes valid at EndCopy.
//   - Modified: the tensor was written on one tier, the others become stale.
//   - Overwrite: the tensor was written afresh on one tier without reading
//     any copy (zeroed, recomputed): that tier becomes the only valid one.
//   - Evict: drop the copy on one tier; the last copy cannot be evicted.
//   - Drop: forget the tensor (activations after backward).
//
// Nothing is stored on the tensors themselves. All methods are safe for
// concurrent use.
type Table struct {
	mu      sync.Mutex
	entries map[Key]*Residency
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{entries: map[Key]*Residency{}} }

func adjacent(a, b Tier) bool {
	return (a == TierDevice && b == TierHost) || (a == TierHost && b == TierDevice) ||
		(a == TierHost && b == TierDisk) || (a == TierDisk && b == TierHost)
}

func (t *Table) fail(k Key, op, reason string) error {
	e := &TransitionError{Key: k, Op: op, Reason: reason}
	if r, ok := t.entries[k]; ok {
		e.State = *r
	}
	return e
}

func (t *Table) getLocked(k Key, op string) (*Residency, error) {
	r, ok := t.entries[k]
	if !ok {
		return nil, t.fail(k, op, "unknown tensor")
	}
	return r, nil
}

// Add records a new tensor of n bytes valid on tier at.
func (t *Table) Add(k Key, n int64, at Tier) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.entries[k]; dup {
		return t.fail(k, "add", "already recorded")
	}
	if at == TierNone || at >= numTiers {
		return t.fail(k, "add", fmt.Sprintf("cannot live on %s", at))
	}
	t.entries[k] = &Residency{Key: k, Bytes: n, Valid: TierSet(0).with(at)}
	return nil
}

// BeginCopy starts a copy of k from one tier to another.
func (t *Table) BeginCopy(k Key, from, to Tier) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.getLocked(k, "copy")
	switch {
	case err != nil:
		return err
	case !adjacent(from, to):
		return t.fail(k, "copy", fmt.Sprintf("no direct path %s->%s", from, to))
	case r.InFlight:
		return t.fail(k, "copy", "another copy is in flight")
	case !r.Valid.Has(from):
		return t.fail(k, "copy", fmt.Sprintf("source %s holds no valid copy", from))
	case r.Valid.Has(to):
		return t.fail(k, "copy", fmt.Sprintf("destination %s is already valid", to))
	}
	r.Moving, r.InFlight = Move{from, to}, true
	return nil
}

// EndCopy completes the copy in flight: its destination becomes valid.
func (t *Table) EndCopy(k Key) error { return t.endCopy(k, true) }

// AbortCopy abandons the copy in flight; the destination stays invalid.
func (t *Table) AbortCopy(k Key) error { return t.endCopy(k, false) }

func (t *Table) endCopy(k Key, ok bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.getLocked(k, "end copy")
	if err != nil {
		return err
	}
	if !r.InFlight {
		return t.fail(k, "end copy", "no copy in flight")
	}
	if ok {
		r.Valid = r.Valid.with(r.Moving.To)
	}
	r.Moving, r.InFlight = Move{}, false
	return nil
}

// Modified records that k was written on tier at: other copies are stale.
func (t *Table) Modified(k Key, at Tier) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.getLocked(k, "modify")
	switch {
	case err != nil:
		return err
	case !r.Valid.Has(at):
		return t.fail(k, "modify", fmt.Sprintf("%s holds no valid copy", at))
	case r.InFlight:
		return t.fail(k, "modify", "a copy is in flight")
	}
	r.Valid = TierSet(0).with(at)
	return nil
}

// Overwrite records that k was written afresh on tier at (zeroed, or
// produced again by a forward) without reading any copy: at becomes the
// only valid tier, whether or not it held a valid copy before. No copy may
// be in flight.
func (t *Table) Overwrite(k Key, at Tier) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.getLocked(k, "overwrite")
	switch {
	case err != nil:
		return err
	case at == TierNone || at >= numTiers:
		return t.fail(k, "overwrite", fmt.Sprintf("cannot live on %s", at))
	case r.InFlight:
		return t.fail(k, "overwrite", "a copy is in flight")
	}
	r.Valid = TierSet(0).with(at)
	return nil
}

// Evict drops k's copy on tier at. The last valid copy cannot be evicted
// (use Drop), nor the source or destination of a copy in flight.
func (t *Table) Evict(k Key, at Tier) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.getLocked(k, "evict")
	switch {
	case err != nil:
		return err
	case !r.Valid.Has(at):
		return t.fail(k, "evict", fmt.Sprintf("%s holds no valid copy", at))
	case r.InFlight && (r.Moving.From == at || r.Moving.To == at):
		return t.fail(k, "evict", "a copy to or from it is in flight")
	case r.Valid.without(at) == 0:
		return t.fail(k, "evict", "it is the only valid copy")
	}
	r.Valid = r.Valid.without(at)
	return nil
}

// Drop forgets k (no copy may be in flight).
func (t *Table) Drop(k Key) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.getLocked(k, "drop")
	if err != nil {
		return err
	}
	if r.InFlight {
		return t.fail(k, "drop", "a copy is in flight")
	}
	delete(t.entries, k)
	return nil
}

// Get returns what is known of k.
func (t *Table) Get(k Key) (Residency, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.entries[k]
	if !ok {
		return Residency{}, false
	}
	return *r, true
}

// Snapshot returns every entry, sorted by layer, class and part.
func (t *Table) Snapshot() []Residency {
	t.mu.Lock()
	out := make([]Residency, 0, len(t.entries))
	for _, r := range t.entries {
		out = append(out, *r)
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key.Layer != out[j].Key.Layer {
			return out[i].Key.Layer < out[j].Key.Layer
		}
		if out[i].Key.Class != out[j].Key.Class {
			return out[i].Key.Class < out[j].Key.Class
		}
		if out[i].Key.Part != out[j].Key.Part {
			return out[i].Key.Part < out[j].Key.Part
		}
		return out[i].Key.MB < out[j].Key.MB
	})
	return out
}

// Bytes returns the bytes with a valid copy on tier at, per class (copies
// in flight to it counted too: their memory is taken).
func (t *Table) Bytes(at Tier) map[Class]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[Class]int64{}
	for _, r := range t.entries {
		if r.Valid.Has(at) || (r.InFlight && r.Moving.To == at) {
			out[r.Key.Class] += r.Bytes
		}
	}
	return out
}
