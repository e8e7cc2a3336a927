// Package schedule compiles the program of one training step (or one
// evaluation pass) of a layered model trained out of core.
//
// A Program is the order of the layers' forward, recompute and backward
// calls over the step's micro-batches, and for every device tensor the
// stretch of that order during which it is resident (its Interval): when
// it is allocated, fetched from the host, zeroed, evicted to the host and
// freed. Compile is pure: it allocates nothing but the program, and
// Program.Peak is exactly what an executor that follows the program holds
// on the device (offload/exec is one). The planner scores candidate
// placements by it, so a plan can never disagree with the run.
//
// Two orders, and every mix of them, are one parameter (Spec.Group):
//
//   - micro-batch-major (Group 1): each micro-batch runs forward through
//     every layer and back before the next starts; only one micro-batch's
//     activations are live, but streamed weights cross to the device twice
//     per micro-batch;
//   - layer-major (Group = MicroBatches, the vertical or zig-zag order of
//     FlexGen and GreedySnake): each layer runs its forward for all the
//     micro-batches of the group, then the next layer; backward likewise
//     from the last layer, which turns each micro-batch around at once
//     (its forward, then its backward, so that the group's logits are
//     never live together). Each streamed layer's weights cross once for the
//     forward and once for the backward of the whole group, its gradients
//     accumulate on the device over the group and leave once, and every
//     micro-batch's boundary activations (kept, recomputed or offloaded as
//     planned) are live across the group.
//
// Each layer's optimizer state (fp32 master and Adam moments) lives where
// Spec.Optimizer says. A layer whose state is on the device keeps its
// weights, gradients, master and moments resident (persistent intervals,
// counted in the peak): its weights are never fetched and its gradients
// never leave, because the backend's AdamW updates them in place once the
// step's gradients are final. The other layers' state is the host's
// concern (host memory or disk): their weights and gradients stream or
// stay as Spec.Weights and Spec.Grads say.
//
// The resident program (Spec.Resident) is the one in which everything is
// persistent: every layer's weights, gradients and optimizer state, and
// the activations and output gradients too, in blocks that the
// micro-batches reuse in turn. An executor allocates it once and then
// only enqueues ops: no allocation, transfer or free during a step.
package schedule

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spill-ml/spill/offload"
)

// Kind is what an Op runs.
type Kind uint8

// Op kinds.
const (
	Forward   Kind = iota
	Recompute      // the forward again, before the backward, from the layer's input
	Backward
)

func (k Kind) String() string { return [...]string{"F", "R", "B"}[k] }

// Op is one call of one layer on one micro-batch.
type Op struct {
	Kind  Kind
	Layer int
	MB    int
}

func (o Op) String() string { return fmt.Sprintf("%s%d.%d", o.Kind, o.Layer, o.MB) }

// Class is the kind of a device tensor of the program.
type Class uint8

// Tensor classes.
const (
	Weights Class = iota // a layer's compute-dtype parameters (one block)
	Grads                // a layer's parameter gradients (one block)
	Acts                 // a layer's saved activations of one micro-batch, output first
	Ckpt                 // a recomputed layer's output of one micro-batch
	DGrad                // the gradient of a layer's output for one micro-batch
	// TGrads is what a layer's backward accumulates for a layer it is
	// tied to (Layer is the tying layer, Of the tied one): kept apart
	// from the tied layer's own gradients and added to them by the tied
	// layer's last backward of the step, so that the sum is the same,
	// bit for bit, in every order of the micro-batches and layers.
	TGrads
	// Master, MomentM and MomentV are a layer's fp32 master weights and
	// Adam moments when its optimizer state is on the device: persistent,
	// used by no op (the update follows the layer's last backward).
	Master
	MomentM
	MomentV
	numClasses
)

func (c Class) String() string { return [...]string{"w", "g", "a", "c", "d", "t", "M", "m", "v"}[c] }

// Offload is the tensor class that budgets and statistics count c under.
func (c Class) Offload() offload.Class {
	switch c {
	case Weights:
		return offload.Weights
	case Grads, TGrads:
		return offload.Grads
	case Acts, Ckpt:
		return offload.Activations
	case Master:
		return offload.Master
	case MomentM:
		return offload.AdamM
	case MomentV:
		return offload.AdamV
	}
	return offload.Workspace
}

// Layer is what the compiler needs to know of one layer, for one
// micro-batch of the step's shape.
type Layer struct {
	// ParamBytes is the size of the layer's weights (and of its
	// gradients) in the compute dtype.
	ParamBytes int64
	// ActBytes is the size of its saved activations, output included.
	ActBytes int64
	// OutBytes is the size of its output (the next layer's input, and
	// what recomputation keeps); 0 for the last layer.
	OutBytes int64
	// SaveBytes is the size of its selective checkpoint: the start of
	// its activations (output first) that a selective recompute
	// (offload.RecomputeSelective) keeps and copies back into the
	// activations before rerunning the rest of the forward. 0 when the
	// layer has none.
	SaveBytes int64
	// Tied lists other layers whose weights this layer reads and for
	// which its backward accumulates gradients (a GPT head reads the
	// embedding's): into a TGrads tensor per tied layer, which the tied
	// layer's last backward of the step adds to its own.
	Tied []int
	// MasterBytes and MomentBytes are the sizes of the layer's fp32
	// master weights (0 when the compute weights are the master, in fp32)
	// and of each Adam moment: device memory when Spec.Optimizer puts the
	// layer's optimizer state on the device.
	MasterBytes, MomentBytes int64
}

// Spec is what Compile compiles.
type Spec struct {
	Layers []Layer
	// MicroBatches is the number of micro-batches of the step (the
	// gradient accumulation steps); 1 for an evaluation pass.
	MicroBatches int
	// Group is how many micro-batches run layer by layer together:
	// 1 (or 0) is micro-batch-major, MicroBatches layer-major; the last
	// group may be smaller.
	Group int
	// Weights and Grads are the homes of the layers' weights and
	// gradients: offload.TierDevice keeps them resident for the whole
	// program (allocated once, before the first op); offload.TierHost
	// streams them (weights fetched before their uses, gradients sent to
	// the host after each run of uses and fetched back to accumulate).
	Weights, Grads offload.Tier
	// Acts is each layer's activation policy (nil: keep all). It is
	// ignored for the first and the last layer, which keep theirs.
	Acts []offload.ActPolicy
	// Prefetch is how many ops ahead of their first use streamed tensors
	// are fetched. 0 means 1.
	Prefetch int
	// Train compiles forward and backward; otherwise the forward only.
	Train bool
	// Optimizer is the tier of each layer's optimizer state (nil: none on
	// the device). A layer with offload.TierDevice keeps its weights,
	// gradients, master and moments resident whatever Weights and Grads
	// say; host and disk are the host's concern and compile alike.
	Optimizer []offload.Tier
	// Resident compiles the program in which everything is persistent,
	// the resident trainer's: it needs Weights and Grads on the device,
	// every layer's optimizer state on the device, every activation kept
	// and one micro-batch at a time (Group 1). Each layer's activations
	// then live in one persistent block that every micro-batch (and the
	// evaluation pass) reuses in turn, and the output gradients in two
	// persistent blocks that consecutive layers' backwards alternate
	// between (Interval.Block), as a trainer without a scheduler would
	// allocate them.
	Resident bool
	// SharedDGrad, with Resident, keeps every output gradient in one
	// block (Block 0): for layers whose backward accepts the same tensor
	// as the gradient of its output and of its input (a residual stream
	// whose gradient each block updates in place, as GPT and Llama blocks
	// do), which then need no copy between the two.
	SharedDGrad bool
}

// OptOnDevice reports whether layer l's optimizer state is on the device.
func (s *Spec) OptOnDevice(l int) bool {
	return l < len(s.Optimizer) && s.Optimizer[l] == offload.TierDevice
}

// Interval is one stretch of device residency of one tensor: a block is
// allocated once op AllocAt has been enqueued (-1: before the first op),
// filled (fetched after op FetchAt, or zeroed, or written by its first
// user), used by ops Start..End and freed once op End has run
// (Persistent ones never: the executor holds them for every program).
type Interval struct {
	Class Class
	Layer int
	MB    int // the micro-batch of activations and their gradients; -1 otherwise
	Of    int // TGrads: the tied layer; -1 otherwise
	Bytes int64

	Start, End int
	AllocAt    int
	// FetchAt is when a fetched interval is copied in: AllocAt, except
	// for persistent weights, which are allocated before the first op and
	// refetched (when the host has updated them) Prefetch ops ahead.
	FetchAt int

	Persistent bool
	// Block identifies a persistent interval's block: persistent
	// intervals of one Class and Block share one block (sized for the
	// largest) in every program an executor runs. It is the Layer, except
	// for the output gradients of a resident program, which alternate
	// between blocks 0 and 1.
	Block int
	Fetch bool // copied in from the host: weights, accumulated grads, offloaded acts
	Zero  bool // zeroed before its first use: the first run of a layer's grads
	Evict bool // copied to the host after op End: grads, offloaded acts
	Final bool // grads: after op End they hold the step's whole gradient
	// CkptOf marks a Ckpt interval that op Start fills by copying the
	// start of the layer's activations (its output, or its selective
	// checkpoint) out of them.
	CkptOf bool
	// Restore marks a selective checkpoint that op End, the layer's
	// recompute, copies back into the start of the layer's activations
	// before it runs.
	Restore bool
	// Src, for offloaded activations coming back, is the index of the
	// interval whose eviction they are copied from (-1 otherwise); Slot
	// is the host buffer both use (see Program.HostSlots).
	Src, Slot int
}

// Program is a compiled schedule. It is immutable and may be shared; an
// executor keeps its own per-interval state, indexed like Intervals.
type Program struct {
	Spec      Spec
	Ops       []Op
	Intervals []Interval
	// Uses lists, for each op, the intervals it reads or writes: the
	// layer's and its tied layers' weights (and grads for a backward),
	// its activations and checkpoint of the op's micro-batch, the input
	// (the previous layer's activations or checkpoint of that
	// micro-batch) and, for a backward, the gradients of its output and
	// input. Ckpt intervals come before Acts intervals.
	Uses [][]int
	// Allocs[i] are the intervals allocated at iteration i: i = 0 before
	// the first op, i = j+1 after op j is enqueued. Fetches[i] are the
	// persistent weights (re)fetched then.
	Allocs, Fetches [][]int
	// Ends[j] are the intervals whose last use is op j.
	Ends [][]int
	// HostSlots are the host buffers offloaded activations go to, by
	// size in bytes: Interval.Slot indexes it.
	HostSlots []int64
}

// Compile lays out the ops and intervals of s.
func Compile(s Spec) (*Program, error) { return compile(s, true) }

// PeakOf is Compile(s) followed by Peak, without the index of each op's
// uses that only an executor needs: what a planner scores candidates by.
func PeakOf(s Spec) (int64, map[offload.Class]int64, Traffic, error) {
	p, err := compile(s, false)
	if err != nil {
		return 0, nil, Traffic{}, err
	}
	peak, by := p.Peak()
	return peak, by, p.Traffic(), nil
}

func compile(s Spec, uses bool) (*Program, error) {
	n := len(s.Layers)
	A := s.MicroBatches
	if n == 0 || A <= 0 {
		return nil, fmt.Errorf("schedule: %d layers and %d micro-batches: both must be positive", n, A)
	}
	if s.Acts != nil && len(s.Acts) != n {
		return nil, fmt.Errorf("schedule: %d activation policies for %d layers", len(s.Acts), n)
	}
	for _, t := range []offload.Tier{s.Weights, s.Grads} {
		if t != offload.TierDevice && t != offload.TierHost {
			return nil, fmt.Errorf("schedule: weights on %s, grads on %s: want device or host", s.Weights, s.Grads)
		}
	}
	for i, a := range s.Acts {
		if a.Selective() && i > 0 && i < n-1 && (s.Layers[i].SaveBytes < s.Layers[i].OutBytes || s.Layers[i].SaveBytes > s.Layers[i].ActBytes) {
			return nil, fmt.Errorf("schedule: layer %d recomputes selectively with a checkpoint of %d bytes (output %d, activations %d)",
				i, s.Layers[i].SaveBytes, s.Layers[i].OutBytes, s.Layers[i].ActBytes)
		}
	}
	if s.Optimizer != nil && len(s.Optimizer) != n {
		return nil, fmt.Errorf("schedule: %d optimizer tiers for %d layers", len(s.Optimizer), n)
	}
	for i, t := range s.Optimizer {
		if t != offload.TierNone && t != offload.TierDevice && t != offload.TierHost && t != offload.TierDisk {
			return nil, fmt.Errorf("schedule: layer %d's optimizer on %s", i, t)
		}
	}
	if s.Resident {
		if err := s.checkResident(); err != nil {
			return nil, err
		}
	} else if s.SharedDGrad {
		return nil, fmt.Errorf("schedule: shared output gradients need a resident program")
	}
	for i, l := range s.Layers {
		for _, t := range l.Tied {
			if t < 0 || t >= n || t == i {
				return nil, fmt.Errorf("schedule: layer %d tied to %d of %d layers", i, t, n)
			}
		}
	}
	G := s.Group
	if G <= 0 {
		G = 1
	}
	G = min(G, A)
	s.Group = G
	depth := max(s.Prefetch, 1)
	c := &compiler{s: s, n: n, A: A, depth: depth}
	if uses {
		c.byKey = map[key][]int{}
	}
	c.ops()
	c.params(Weights)
	if s.Train {
		c.params(Grads)
		c.tied()
	}
	c.optim()
	c.acts()
	if uses {
		c.index()
		c.spans()
	}
	return c.p, nil
}

// dgradBlock is the block of the gradient of layer l's output in a
// resident program.
func (s *Spec) dgradBlock(l int) int {
	if s.SharedDGrad {
		return 0
	}
	return l % 2
}

// checkResident reports why s cannot be compiled as the resident program.
func (s *Spec) checkResident() error {
	if s.Weights != offload.TierDevice || s.Grads != offload.TierDevice {
		return fmt.Errorf("schedule: a resident program keeps weights and grads on the device, not %s and %s", s.Weights, s.Grads)
	}
	for l := range s.Layers {
		if !s.OptOnDevice(l) {
			return fmt.Errorf("schedule: a resident program keeps every layer's optimizer state on the device (layer %d's is not)", l)
		}
		if s.policy(l) != offload.Keep {
			return fmt.Errorf("schedule: a resident program keeps every layer's activations (layer %d: %s)", l, s.policy(l))
		}
	}
	if s.Group > 1 && s.MicroBatches > 1 {
		return fmt.Errorf("schedule: a resident program runs one micro-batch at a time, not groups of %d", s.Group)
	}
	return nil
}

// policy is layer l's activation policy: Keep for the first and the last.
func (s *Spec) policy(l int) offload.ActPolicy {
	if s.Acts == nil || l == 0 || l == len(s.Layers)-1 {
		return offload.Keep
	}
	return s.Acts[l]
}

type compiler struct {
	s     Spec
	n, A  int
	depth int
	p     *Program
	// op index of F, R, B of (layer, mb): [l*A+k]; -1 when absent
	fwd, rec, bwd []int
	// per (class, layer, mb) key: the intervals, in order
	byKey map[key][]int
}

type key struct {
	c     Class
	l, mb int
}

func (c *compiler) ops() {
	s, n, A := &c.s, c.n, c.A
	c.p = &Program{Spec: *s}
	c.fwd, c.rec, c.bwd = fill(n*A), fill(n*A), fill(n*A)
	add := func(k Kind, l, mb int, idx []int) {
		idx[l*A+mb] = len(c.p.Ops)
		c.p.Ops = append(c.p.Ops, Op{k, l, mb})
	}
	for g0 := 0; g0 < A; g0 += s.Group {
		g1 := min(g0+s.Group, A)
		// Training, the last layer turns each micro-batch around at
		// once (its forward, then its backward): a group's outputs of the
		// last layer (a language model's logits, often the largest
		// activations of all) are then never live together.
		last := n
		if s.Train {
			last = n - 1
		}
		for l := 0; l < last; l++ {
			for k := g0; k < g1; k++ {
				add(Forward, l, k, c.fwd)
			}
		}
		if !s.Train {
			continue
		}
		for k := g0; k < g1; k++ {
			add(Forward, n-1, k, c.fwd)
			add(Backward, n-1, k, c.bwd)
		}
		for l := n - 2; l >= 0; l-- {
			for k := g0; k < g1; k++ {
				if s.policy(l).Recomputes() {
					add(Recompute, l, k, c.rec)
				}
				add(Backward, l, k, c.bwd)
			}
		}
	}
}

func fill(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = -1
	}
	return s
}

func (c *compiler) add(iv Interval, lookahead int) int {
	iv.AllocAt = iv.Start - lookahead - 1
	if iv.Persistent {
		iv.AllocAt = -1
	}
	iv.AllocAt = max(iv.AllocAt, -1)
	iv.FetchAt = iv.AllocAt
	if iv.Persistent && iv.Fetch {
		iv.FetchAt = max(iv.Start-lookahead-1, -1)
	}
	if (iv.Class != Acts && iv.Class != Ckpt && iv.Class != TGrads) || !(iv.Fetch || iv.Evict) {
		iv.Src, iv.Slot = -1, -1 // only offloaded activations and tied gradients have a host slot
	}
	if iv.Class != TGrads {
		iv.Of = -1
	}
	if iv.Class != DGrad || !iv.Persistent {
		iv.Block = iv.Layer
	}
	i := len(c.p.Intervals)
	c.p.Intervals = append(c.p.Intervals, iv)
	if c.byKey != nil {
		k := key{iv.Class, iv.Layer, iv.MB}
		c.byKey[k] = append(c.byKey[k], i)
	}
	return i
}

// params lays out the weights' (or gradients') intervals: for each layer,
// the ops that need its tensor (its own and those of layers tied to it,
// backward only for gradients), merged into one interval per run of
// adjacent ops, or one over all when resident.
func (c *compiler) params(cl Class) {
	s := &c.s
	tier := s.Weights
	if cl == Grads {
		tier = s.Grads
	}
	uses := make([][]int, c.n)
	for j, op := range c.p.Ops {
		if cl == Grads && op.Kind == Forward && op.Layer != c.n-1 {
			continue
		}
		uses[op.Layer] = append(uses[op.Layer], j)
		if cl == Grads {
			// Nor is the last layer's forward, but it interleaves with the
			// layer's backwards likewise (ops); trimmed below.
			// A recompute is not a user, but a layer-major backward
			// interleaves it with the layer's backwards: one run, not one
			// per micro-batch. Tying layers accumulate into TGrads.
			continue
		}
		for _, t := range s.Layers[op.Layer].Tied {
			uses[t] = append(uses[t], j)
		}
	}
	for l := 0; l < c.n; l++ {
		u := uses[l]
		if len(u) > 1 {
			sortInts(u) // tied layers' uses interleave
		}
		// A layer updated on the device keeps its weights and gradients
		// there: nothing to fetch, nothing to send.
		devOpt := s.OptOnDevice(l)
		resident := tier == offload.TierDevice || devOpt
		rs := runs(u, resident)
		if cl == Grads {
			rs = c.trim(rs)
		}
		for i, r := range rs {
			iv := Interval{Class: cl, Layer: l, MB: -1, Bytes: s.Layers[l].ParamBytes, Start: r[0], End: r[1], Persistent: resident}
			la := c.depth
			if cl == Weights {
				iv.Fetch = !devOpt
			} else {
				iv.Zero, iv.Fetch, iv.Evict, iv.Final = i == 0, i > 0, !devOpt, i == len(rs)-1
				if iv.Zero {
					la = 0
				}
			}
			c.add(iv, la)
		}
	}
}

// tied lays out the TGrads of each (tying layer, tied layer): used by the
// tying layer's backwards and by the tied layer's last backward of the
// step, which adds them to its gradients. Streamed gradients are sent to
// a host slot between runs (and fetched back); the last run is consumed
// on the device.
func (c *compiler) tied() {
	s := &c.s
	lastB := map[int]int{} // the last backward of each layer
	for j, op := range c.p.Ops {
		if op.Kind == Backward {
			lastB[op.Layer] = j
		}
	}
	resident := s.Grads == offload.TierDevice
	for i, l := range s.Layers {
		for _, t := range l.Tied {
			var u []int
			for j, op := range c.p.Ops {
				if op.Layer == i && (op.Kind != Forward || i == c.n-1) {
					u = append(u, j)
				}
			}
			u = append(u, lastB[t])
			sortInts(u)
			rs := c.trim(runs(u, resident))
			slot := -1
			prev := -1
			for k, r := range rs {
				iv := Interval{Class: TGrads, Layer: i, Of: t, MB: -1, Bytes: s.Layers[t].ParamBytes, Start: r[0], End: r[1],
					Persistent: resident, Zero: k == 0, Fetch: k > 0, Evict: k < len(rs)-1, Src: -1, Slot: -1}
				if !resident && len(rs) > 1 {
					if slot < 0 {
						slot = len(c.p.HostSlots)
						c.p.HostSlots = append(c.p.HostSlots, iv.Bytes)
					}
					iv.Slot, iv.Src = slot, prev
				}
				la := c.depth
				if iv.Zero {
					la = 0
				}
				idx := c.add(iv, la)
				if iv.Fetch {
					in := &c.p.Intervals[idx]
					in.AllocAt = max(in.AllocAt, c.p.Intervals[prev].End)
					in.FetchAt = in.AllocAt
				}
				prev = idx
			}
		}
	}
}

// optim lays out the persistent master and moments of every layer whose
// optimizer state is on the device, spanning the op after which the
// layer is updated: its last backward (its last forward in an evaluation
// pass, which updates nothing but holds them all the same).
func (c *compiler) optim() {
	s := &c.s
	last := make([]int, c.n)
	for j, op := range c.p.Ops {
		if op.Kind == Backward || !s.Train {
			last[op.Layer] = j
		}
	}
	for l, ly := range s.Layers {
		if !s.OptOnDevice(l) {
			continue
		}
		for _, o := range []struct {
			cl    Class
			bytes int64
		}{{Master, ly.MasterBytes}, {MomentM, ly.MomentBytes}, {MomentV, ly.MomentBytes}} {
			if o.bytes > 0 {
				c.add(Interval{Class: o.cl, Layer: l, MB: -1, Bytes: o.bytes, Start: last[l], End: last[l], Persistent: true}, 0)
			}
		}
	}
}

// acts lays out the activations, checkpoints and output gradients of
// every (layer, micro-batch).
func (c *compiler) acts() {
	s, n, A := &c.s, c.n, c.A
	at := func(idx []int, l, k int) int { return idx[l*A+k] }
	slots := map[[2]int]int{} // (layer, mb within group) -> host slot
	// ckpt is the size of a recomputed layer's checkpoint, its last use
	// and whether its recompute restores it (a selective one).
	ckpt := func(ly Layer, l, k int) (int64, int, bool) {
		if s.policy(l).Selective() {
			return ly.SaveBytes, at(c.rec, l, k), true
		}
		return ly.OutBytes, at(c.bwd, l+1, k), false
	}
	for k := 0; k < A; k++ {
		for l := 0; l < n; l++ {
			ly := s.Layers[l]
			f := at(c.fwd, l, k)
			if !s.Train {
				end := f
				if l+1 < n {
					end = at(c.fwd, l+1, k)
				}
				c.add(Interval{Class: Acts, Layer: l, MB: k, Bytes: ly.ActBytes, Start: f, End: end, Persistent: s.Resident}, 0)
				continue
			}
			b := at(c.bwd, l, k)
			switch s.policy(l) {
			case offload.Keep:
				c.add(Interval{Class: Acts, Layer: l, MB: k, Bytes: ly.ActBytes, Start: f, End: b, Persistent: s.Resident}, 0)
			case offload.Recompute, offload.RecomputeSelective:
				// The forward writes the activations and copies its output
				// into the checkpoint, the next layer's input until that
				// layer's backward; the recompute writes them again. A
				// selective checkpoint is larger (SaveBytes) and lives on
				// to the layer's own recompute, which restores it.
				bytes, end, sel := ckpt(ly, l, k)
				c.add(Interval{Class: Ckpt, Layer: l, MB: k, Bytes: bytes, Start: f, End: end, CkptOf: true, Restore: sel}, 0)
				c.add(Interval{Class: Acts, Layer: l, MB: k, Bytes: ly.ActBytes, Start: f, End: f}, 0)
				c.add(Interval{Class: Acts, Layer: l, MB: k, Bytes: ly.ActBytes, Start: at(c.rec, l, k), End: b}, 0)
			case offload.RecomputeHost, offload.RecomputeSelectiveHost:
				// As Recompute, but the checkpoint goes to a host slot once
				// the next layer's forward has read it and comes back for
				// that layer's recompute or backward.
				bytes, end, sel := ckpt(ly, l, k)
				slot := c.slot(slots, l, k, bytes)
				out := c.add(Interval{Class: Ckpt, Layer: l, MB: k, Bytes: bytes, Start: f, End: at(c.fwd, l+1, k),
					CkptOf: true, Evict: true, Src: -1, Slot: slot}, 0)
				back := at(c.rec, l+1, k)
				if back < 0 {
					back = at(c.bwd, l+1, k)
				}
				in := c.add(Interval{Class: Ckpt, Layer: l, MB: k, Bytes: bytes, Start: back, End: end,
					Fetch: true, Src: out, Slot: slot, Restore: sel}, c.depth)
				iv := &c.p.Intervals[in]
				iv.AllocAt = max(iv.AllocAt, c.p.Intervals[out].End)
				iv.FetchAt = iv.AllocAt
				c.add(Interval{Class: Acts, Layer: l, MB: k, Bytes: ly.ActBytes, Start: f, End: f}, 0)
				c.add(Interval{Class: Acts, Layer: l, MB: k, Bytes: ly.ActBytes, Start: at(c.rec, l, k), End: b}, 0)
			case offload.OffloadTo:
				// Out: from the forward to the next layer's forward, which
				// reads the output; back: from the next layer's recompute
				// or backward (which read it again) to the layer's own
				// backward, fetched ahead but never before the copy out
				// has been enqueued.
				slot := c.slot(slots, l, k, ly.ActBytes)
				out := c.add(Interval{Class: Acts, Layer: l, MB: k, Bytes: ly.ActBytes, Start: f, End: at(c.fwd, l+1, k),
					Evict: true, Src: -1, Slot: slot}, 0)
				back := at(c.rec, l+1, k)
				if back < 0 {
					back = at(c.bwd, l+1, k)
				}
				in := c.add(Interval{Class: Acts, Layer: l, MB: k, Bytes: ly.ActBytes, Start: back, End: b,
					Fetch: true, Src: out, Slot: slot}, c.depth)
				iv := &c.p.Intervals[in]
				iv.AllocAt = max(iv.AllocAt, c.p.Intervals[out].End)
				iv.FetchAt = iv.AllocAt
			}
			if l > 0 {
				// The gradient of layer l-1's output: written by layer l's
				// backward, read by layer l-1's.
				c.add(Interval{Class: DGrad, Layer: l - 1, MB: k, Bytes: s.Layers[l-1].OutBytes, Start: b, End: at(c.bwd, l-1, k),
					Persistent: s.Resident, Block: s.dgradBlock(l - 1)}, 0)
			}
		}
	}
}

// slot is the host slot of layer l's micro-batch k: one per micro-batch
// of a group (a group's copies out all precede its copies back; the next
// group's copy out follows, through the compute queue, the backward that
// consumed the copy back).
func (c *compiler) slot(slots map[[2]int]int, l, k int, bytes int64) int {
	sk := [2]int{l, k % c.s.Group}
	slot, ok := slots[sk]
	if !ok {
		slot = len(c.p.HostSlots)
		slots[sk] = slot
		c.p.HostSlots = append(c.p.HostSlots, bytes)
	}
	return slot
}

// covering is the interval of key k that contains op j, or -1.
func (c *compiler) covering(k key, j int) int {
	for _, i := range c.byKey[k] {
		if iv := &c.p.Intervals[i]; iv.Start <= j && j <= iv.End {
			return i
		}
	}
	return -1
}

// index fills Uses.
func (c *compiler) index() {
	p, s := c.p, &c.s
	p.Uses = make([][]int, len(p.Ops))
	for j, op := range p.Ops {
		var u []int
		use := func(k key) {
			if i := c.covering(k, j); i >= 0 {
				u = append(u, i)
			}
		}
		// Checkpoints first: a layer's full activations, where live,
		// override its checkpoint when an executor binds them.
		if op.Layer > 0 {
			use(key{Ckpt, op.Layer - 1, op.MB})
		}
		use(key{Ckpt, op.Layer, op.MB})
		if op.Layer > 0 {
			use(key{Acts, op.Layer - 1, op.MB})
		}
		use(key{Acts, op.Layer, op.MB})
		for _, l := range append([]int{op.Layer}, s.Layers[op.Layer].Tied...) {
			use(key{Weights, l, -1})
		}
		if op.Kind == Backward {
			use(key{Grads, op.Layer, -1})
			use(key{TGrads, op.Layer, -1})
			for i, l := range s.Layers {
				if i != op.Layer && slices.Contains(l.Tied, op.Layer) {
					use(key{TGrads, i, -1}) // its last backward adds them
				}
			}
		}
		if op.Kind == Backward {
			use(key{DGrad, op.Layer, op.MB})
			if op.Layer > 0 {
				use(key{DGrad, op.Layer - 1, op.MB})
			}
		}
		p.Uses[j] = u
	}
}

// spans fills Allocs, Fetches and Ends.
func (c *compiler) spans() {
	p := c.p
	p.Allocs = make([][]int, len(p.Ops)+1)
	p.Fetches = make([][]int, len(p.Ops)+1)
	p.Ends = make([][]int, len(p.Ops))
	for i, iv := range p.Intervals {
		p.Allocs[iv.AllocAt+1] = append(p.Allocs[iv.AllocAt+1], i)
		if iv.Persistent && iv.Fetch {
			p.Fetches[iv.FetchAt+1] = append(p.Fetches[iv.FetchAt+1], i)
		}
		p.Ends[iv.End] = append(p.Ends[iv.End], i)
	}
}

// trim drops the forwards at either end of each run (the last layer's,
// which interleave with its backwards but use no gradients) and the runs
// of forwards only.
func (c *compiler) trim(rs [][2]int) [][2]int {
	out := rs[:0]
	for _, r := range rs {
		for r[0] <= r[1] && c.p.Ops[r[0]].Kind == Forward {
			r[0]++
		}
		for r[1] >= r[0] && c.p.Ops[r[1]].Kind == Forward {
			r[1]--
		}
		if r[0] <= r[1] {
			out = append(out, r)
		}
	}
	return out
}

// runs splits sorted op indexes into runs of adjacent ones ([first, last]
// each), or one run over all when whole.
func runs(idx []int, whole bool) [][2]int {
	if len(idx) == 0 {
		return nil
	}
	if whole {
		return [][2]int{{idx[0], idx[len(idx)-1]}}
	}
	var out [][2]int
	cur := [2]int{idx[0], idx[0]}
	for _, j := range idx[1:] {
		if j <= cur[1]+1 {
			cur[1] = max(cur[1], j)
			continue
		}
		out = append(out, cur)
		cur = [2]int{j, j}
	}
	return append(out, cur)
}

func sortInts(s []int) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// RoundBlock is the device cache's rounding of a block in its Whole mode,
// which an executor that follows a program uses (offload.CacheConfig).
func RoundBlock(n int64) int64 { return (max(n, 1) + 511) &^ 511 }

// Peak is the device memory the program's intervals hold at most, as an
// executor that allocates and frees them in the program's order holds
// them (each block rounded as RoundBlock), and the bytes of each class
// live at that moment. Ended intervals are freed at the iteration after
// the one that follows their last op (the executor frees them there, in
// the program's order, and their memory is reused once that op and any
// copy out have finished: offload.Cache.FreeAfter).
func (p *Program) Peak() (int64, map[offload.Class]int64) {
	// delta[it][class]: bytes allocated minus bytes freed at iteration it.
	delta := make([][numClasses]int64, len(p.Ops)+2)
	persistent := map[[2]int]int64{} // (class, block) -> bytes
	for i := range p.Intervals {
		iv := &p.Intervals[i]
		b := RoundBlock(iv.Bytes)
		if iv.Persistent {
			k := [2]int{int(iv.Class), iv.Block}
			persistent[k] = max(persistent[k], b)
			continue
		}
		delta[iv.AllocAt+1][iv.Class] += b
		delta[min(iv.End+2, len(p.Ops)+1)][iv.Class] -= b
	}
	for k, b := range persistent {
		delta[0][k[0]] += b // allocated before the first op
	}
	var live, peak int64
	var liveBy, peakBy [numClasses]int64
	for it := 0; it <= len(p.Ops); it++ {
		// Frees come first within an iteration: they are sums, and the
		// executor frees before it allocates.
		for cl, d := range delta[it] {
			if d < 0 {
				live += d
				liveBy[cl] += d
			}
		}
		for cl, d := range delta[it] {
			if d > 0 {
				live += d
				liveBy[cl] += d
			}
		}
		if live > peak {
			peak, peakBy = live, liveBy
		}
	}
	by := map[offload.Class]int64{}
	for cl, n := range peakBy {
		if n != 0 {
			by[Class(cl).Offload()] += n
		}
	}
	return peak, by
}

// Traffic is the bytes a program moves between host and device when it
// runs once.
type Traffic struct {
	H2D, D2H int64
}

// Traffic counts every fetch and eviction of the program; resident
// weights count once (they are refetched once per step, after the host
// optimizer has updated them).
func (p *Program) Traffic() Traffic {
	var t Traffic
	for _, iv := range p.Intervals {
		if iv.Fetch {
			t.H2D += iv.Bytes
		}
		if iv.Evict {
			t.D2H += iv.Bytes
		}
	}
	return t
}

// HostBytes is the host memory the offloaded activations' slots take.
func (p *Program) HostBytes() int64 {
	var n int64
	for _, b := range p.HostSlots {
		n += b
	}
	return n
}

// String dumps the program: one line per op with what it uses, and one
// per interval, for tests and debugging.
func (p *Program) String() string {
	var b strings.Builder
	for j, op := range p.Ops {
		fmt.Fprintf(&b, "%3d %-7s", j, op)
		for _, i := range p.Uses[j] {
			fmt.Fprintf(&b, " %s", p.Intervals[i].name())
		}
		b.WriteByte('\n')
	}
	for i := range p.Intervals {
		iv := &p.Intervals[i]
		fmt.Fprintf(&b, "%-6s [%d,%d] alloc %d", iv.name(), iv.Start, iv.End, iv.AllocAt)
		if iv.FetchAt != iv.AllocAt {
			fmt.Fprintf(&b, " fetch-at %d", iv.FetchAt)
		}
		for _, f := range []struct {
			on   bool
			name string
		}{{iv.Persistent, "persistent"}, {iv.Fetch, "fetch"}, {iv.Zero, "zero"}, {iv.Evict, "evict"}, {iv.Final, "final"}, {iv.CkptOf, "ckpt"}, {iv.Restore, "restore"}} {
			if f.on {
				b.WriteString(" " + f.name)
			}
		}
		if iv.Slot >= 0 {
			fmt.Fprintf(&b, " slot %d", iv.Slot)
		}
		if iv.Block != iv.Layer {
			fmt.Fprintf(&b, " block %d", iv.Block)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func (iv *Interval) name() string {
	if iv.Class == TGrads {
		return fmt.Sprintf("t%d>%d", iv.Layer, iv.Of)
	}
	if iv.MB < 0 {
		return fmt.Sprintf("%s%d", iv.Class, iv.Layer)
	}
	return fmt.Sprintf("%s%d.%d", iv.Class, iv.Layer, iv.MB)
}
