package offload

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spill-ml/spill/kernels"
)

// Budgets are the bytes each tier may hold. Disk 0 means no disk tier.
type Budgets struct {
	Device, Host, Disk int64
}

// ActPolicy is what a layer does with its saved activations.
type ActPolicy uint8

// Activation policies.
const (
	Keep      ActPolicy = iota // keep on the device until backward
	OffloadTo                  // copy to the host during forward, back for backward
	Recompute                  // keep only the input; rerun the forward in backward
	// RecomputeHost recomputes like Recompute and keeps the layer's output
	// (the next layer's input, its checkpoint) on the host between the
	// next layer's forward and backward: what lets a layer-major step hold
	// every micro-batch's boundary without device memory.
	RecomputeHost
	// RecomputeSelective keeps, with the layer's output, what its
	// attention computed (its output and log-sum-exp: the layer's
	// selective checkpoint), and reruns the rest of the forward (norms,
	// projections, MLP input) in backward, not the attention; it costs
	// about the output's bytes again and saves the attention and one
	// projection of the recomputation. Only layers that declare a
	// selective checkpoint may take it.
	RecomputeSelective
	// RecomputeSelectiveHost is RecomputeSelective with the checkpoint on
	// the host as RecomputeHost's.
	RecomputeSelectiveHost
)

func (a ActPolicy) String() string {
	return [...]string{"keep", "offload", "recompute", "recompute-host", "recompute-selective", "recompute-selective-host"}[a]
}

// Recomputes reports whether the policy reruns the layer's forward (or,
// selective, part of it).
func (a ActPolicy) Recomputes() bool { return a >= Recompute }

// Selective reports whether the policy keeps the layer's selective
// checkpoint and reruns only part of its forward.
func (a ActPolicy) Selective() bool { return a == RecomputeSelective || a == RecomputeSelectiveHost }

// CkptOnHost reports whether the policy keeps its checkpoint on the host.
func (a ActPolicy) CkptOnHost() bool { return a == RecomputeHost || a == RecomputeSelectiveHost }

// MarshalText prints the policy by name in JSON.
func (a ActPolicy) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// LayerPlan is one layer's activation policy and the tier of its
// optimizer state (fp32 master and Adam moments).
type LayerPlan struct {
	Name      string    `json:"name"`
	Params    int64     `json:"params"`
	Policy    ActPolicy `json:"activations"`
	Optimizer Tier      `json:"optimizer"`
}

// TierUse is the predicted peak use of one tier.
type TierUse struct {
	Tier    Tier            `json:"tier"`
	Budget  int64           `json:"budget"`
	Peak    int64           `json:"peak"`
	ByClass map[Class]int64 `json:"by_class"`
	// Reserve is what the profile leaves to others; Slack the allowance
	// for allocator rounding and fragmentation (5% on the device).
	Reserve int64 `json:"reserve"`
	Slack   int64 `json:"slack"`
}

// Busy is the predicted time, in seconds per step, each resource is busy.
type Busy struct {
	Compute       float64 `json:"compute"`
	H2D           float64 `json:"h2d"`
	D2H           float64 `json:"d2h"`
	HostOptimizer float64 `json:"host_optimizer"`
	Disk          float64 `json:"disk"`
	// Comm is the gradients' reduction across the ranks of a
	// data-parallel job (the comm queue), 0 for one rank.
	Comm float64 `json:"comm,omitempty"`
}

// Placement is a plan: where every tensor class lives, the activation
// policy and micro-batching, and the predicted peak memory and step time.
type Placement struct {
	Model      string    `json:"model"`
	Params     int64     `json:"params"`
	Precision  Precision `json:"precision"`
	SeqLen     int       `json:"seq_len"`
	Batch      int       `json:"batch"`
	MicroBatch int       `json:"micro_batch"`
	Accum      int       `json:"accum"`
	// Group is how many micro-batches run layer by layer together: 1 is
	// micro-batch-major, Accum layer-major (offload/schedule).
	Group int `json:"group"`
	// Weights, Grads and Optimizer (master, adam_m, adam_v) are the tiers
	// holding each class's home copy. Weights not on the device are
	// streamed PrefetchDepth layers ahead; gradients on the host are sent
	// layer by layer as backward produces them.
	//
	// Optimizer is TierDevice only for the resident trainer (everything
	// on the device). Out of core, the optimizer state is placed per
	// layer (Layers[i].Optimizer): OptimizerLayers counts the layers on
	// the device (their weights and gradients stay there too, and the
	// device's AdamW updates them), on the host (host AdamW) and on disk
	// (the moments, read ahead and written back around the host AdamW),
	// and Optimizer is the lowest of those tiers (disk when any layer's is
	// there, else host). OptimizerWhy says why the split is what it is.
	Weights         Tier   `json:"weights"`
	Grads           Tier   `json:"grads"`
	Optimizer       Tier   `json:"optimizer"`
	OptimizerLayers [3]int `json:"optimizer_layers"`
	OptimizerWhy    string `json:"optimizer_why,omitempty"`
	// MasterOnDisk says the disk layers keep their fp32 master weights on
	// disk with their moments (mixed precision or a delayed update only:
	// the host then holds their compute-dtype weights and gradients).
	MasterOnDisk  bool `json:"master_on_disk,omitempty"`
	PrefetchDepth int  `json:"prefetch_depth"`
	// Keep, Offload and Recompute count the layers of each activation
	// policy; Layers gives each layer's.
	Keep      int `json:"act_keep"`
	Offload   int `json:"act_offload"`
	Recompute int `json:"act_recompute"`
	// CheckpointsOnHost says the recomputed layers keep their checkpoints
	// on the host (RecomputeHost).
	CheckpointsOnHost bool `json:"checkpoints_on_host,omitempty"`
	// Selective says the recomputed layers keep selective checkpoints
	// (their output and attention's: RecomputeSelective) and rerun only
	// the rest of their forward.
	Selective bool `json:"selective_recompute,omitempty"`
	// SpeculativeUpdate says the host optimizer updates each host layer
	// as soon as its gradients are final, during the backward, before the
	// step's gradient norm is known, assuming they will not be clipped:
	// into a second copy of the layer's master, weights and moments,
	// which replaces the first when the norm is within the clip (the
	// same bits as updating after the norm) and is dropped otherwise (the
	// layer is then updated after the norm, as without it; and the next
	// step does not speculate). It takes a second copy of the host layers'
	// state (plan.SpecState).
	SpeculativeUpdate bool `json:"speculative_update,omitempty"`
	// Notes are the trainer's remarks on how it carries the plan out
	// (such as the model's lean activations), printed under the placement.
	Notes  []string    `json:"notes,omitempty"`
	Layers []LayerPlan `json:"layers"`
	// Memory is the predicted peak of device, host and disk, in that order.
	Memory []TierUse `json:"memory"`
	// StepTime is the predicted seconds per optimizer step.
	StepTime     float64  `json:"step_time_s"`
	TokensPerSec float64  `json:"tokens_per_s"`
	Busy         Busy     `json:"busy_s"`
	Bottleneck   string   `json:"bottleneck"`
	Hardware     Hardware `json:"hardware"`
	// Ranks, when above 1, is the world size of a data-parallel job: one
	// process per GPU, each running this placement on its own Batch
	// sequences (the job's step trains Ranks x Batch), gradients
	// all-reduced across the ranks. Memory is per rank: the device budget
	// is each GPU's, the host and disk budgets each rank's share of its
	// node's (Data.NodeHost, Data.NodeDisk over Data.LocalRanks).
	// TokensPerSec is the job's, all ranks together. Data is nil for one
	// rank.
	Data *DataParallel `json:"data_parallel,omitempty"`
	// Alternatives are the best candidates of the other families of
	// placements and why they lost: the planner's reasons.
	Alternatives []Alternative `json:"alternatives,omitempty"`
}

// DataParallel is the per-rank side of a placement of several ranks.
type DataParallel struct {
	Ranks      int `json:"ranks"`
	LocalRanks int `json:"local_ranks"`
	// NodeHost and NodeDisk are the node's budgets the per-rank ones
	// (Memory) are shares of: each rank's is NodeX / LocalRanks.
	NodeHost int64 `json:"node_host_budget"`
	NodeDisk int64 `json:"node_disk_budget"`
	// ShardOptimizer says each rank holds 1/Ranks of every layer's
	// optimizer state (ZeRO-1/2: kernels.ShardLen elements of its fp32
	// master and moments), updates that share and all-gathers the updated
	// weights; the gradients are reduce-scattered. ShardWhy says why it
	// is on or off.
	ShardOptimizer bool   `json:"shard_optimizer"`
	ShardWhy       string `json:"shard_why,omitempty"`
	// GradBytes is what each rank reduces per step (its compute-dtype
	// gradients); Interconnect the bus bandwidth the plan assumed.
	GradBytes    int64   `json:"grad_bytes"`
	Interconnect float64 `json:"interconnect_bytes_per_s"`
	// CommExposed is the part of Busy.Comm the backward does not hide:
	// the last layers' reductions (the comm queue's tail after the
	// backward) and, for layers whose optimizer is on the host, the
	// compute queue's wait for their reduction before their gradients
	// leave (engine/ddp.go).
	CommExposed float64 `json:"comm_exposed_s"`
}

// Alternative is a placement the planner did not choose.
type Alternative struct {
	Family   string  `json:"family"`
	Summary  string  `json:"summary"`
	StepTime float64 `json:"step_time_s"`
	Why      string  `json:"why"`
}

// Order names the placement's order of micro-batches and layers.
func (p *Placement) Order() string {
	switch {
	case p.Accum <= 1 || p.Group <= 1:
		return "micro-batch-major"
	case p.Group >= p.Accum:
		return "layer-major"
	}
	return fmt.Sprintf("layer-major in groups of %d micro-batches", p.Group)
}

// Summary is the placement in one line.
func (p *Placement) Summary() string {
	sel := ""
	if p.Selective && p.Recompute > 0 {
		sel = " selective"
	}
	return fmt.Sprintf("weights on %s, grads on %s, optimizer on %s, micro-batch %d x %d, %s, activations keep %d / offload %d / recompute %d%s",
		p.Weights, p.Grads, p.OptimizerSplit(), p.MicroBatch, p.Accum, p.Order(), p.Keep, p.Offload, p.Recompute, sel)
}

// OptimizerSplit names where the optimizer state lives: one tier, or the
// layers on each ("device 5 / host 30 / disk 7 layers").
func (p *Placement) OptimizerSplit() string {
	n := p.OptimizerLayers
	var parts []string
	for i, t := range []Tier{TierDevice, TierHost, TierDisk} {
		if n[i] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", t, n[i]))
		}
	}
	if len(parts) < 2 {
		return p.Optimizer.String()
	}
	return strings.Join(parts, " / ") + " layers"
}

// Hint is a one-line summary for budget errors.
func (p *Placement) Hint() string { return "a plan that fits: " + p.Summary() }

// ErrInfeasible is wrapped by the error Plan returns when no placement fits.
var ErrInfeasible = errors.New("offload: no placement fits the budgets")

// Shortfall is how much a tier is short.
type Shortfall struct {
	Tier         Tier
	Need, Budget int64
}

// InfeasibleError explains why no placement fits: the shortfalls of the
// placement that came closest.
type InfeasibleError struct {
	Shortfalls []Shortfall
	NoDisk     bool       // there was no disk tier
	Closest    *Placement // the placement that came closest, with its predicted peaks
}

func (e *InfeasibleError) Error() string {
	var b strings.Builder
	b.WriteString("offload: no placement fits the budgets: ")
	for i, s := range e.Shortfalls {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s short by %s (needs %s, budget %s)", s.Tier, kernels.FormatBytes(s.Need-s.Budget),
			kernels.FormatBytes(s.Need), kernels.FormatBytes(s.Budget))
	}
	if p := e.Closest; p != nil {
		fmt.Fprintf(&b, ", even with %s", p.Summary())
	}
	if len(e.Shortfalls) > 0 {
		b.WriteString("; it would fit with")
		for i, s := range e.Shortfalls {
			if i > 0 {
				b.WriteString(" and")
			}
			fmt.Fprintf(&b, " a %s budget of %s", s.Tier, kernels.FormatBytes(s.Need))
		}
	}
	if e.NoDisk {
		b.WriteString("; there is no disk tier: a disk budget could hold the weights and optimizer state")
	}
	return b.String()
}

func (e *InfeasibleError) Unwrap() error { return ErrInfeasible }

// UnmarshalText parses a policy name.
func (a *ActPolicy) UnmarshalText(b []byte) error {
	for _, p := range []ActPolicy{Keep, OffloadTo, Recompute, RecomputeHost, RecomputeSelective, RecomputeSelectiveHost} {
		if p.String() == string(b) {
			*a = p
			return nil
		}
	}
	return fmt.Errorf("offload: unknown activation policy %q", b)
}
