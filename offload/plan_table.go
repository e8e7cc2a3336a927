package offload

import (
	"fmt"
	"io"
	"strings"

	"github.com/spill-ml/spill/kernels"
)

// WriteTable prints the placement for people: placement, predicted peak
// memory per tier and class, time per step by resource with the
// bottleneck, and the activation policy of every layer (runs of layers
// with the same policy on one line).
func (p *Placement) WriteTable(w io.Writer) error {
	var b strings.Builder
	params := fmt.Sprintf("%.1f M", float64(p.Params)/1e6)
	if p.Params >= 1e9 {
		params = fmt.Sprintf("%.2f B", float64(p.Params)/1e9)
	}
	fmt.Fprintf(&b, "model      %s, %s params, %s, seq %d\n", p.Model, params, p.Precision, p.SeqLen)
	fmt.Fprintf(&b, "batch      %d sequences = micro-batch %d x %d accumulation steps, %s\n", p.Batch, p.MicroBatch, p.Accum, p.Order())
	fmt.Fprintf(&b, "hardware   %s\n", p.Hardware.Name)
	if d := p.Data; d != nil {
		fmt.Fprintf(&b, "ranks      %d data parallel (%d on this node, one process per GPU), %d sequences a step in all; the plan and memory are per rank\n",
			d.Ranks, d.LocalRanks, d.Ranks*p.Batch)
		sh := "not sharded: every rank holds all of it"
		if d.ShardOptimizer {
			sh = fmt.Sprintf("sharded %d ways (ZeRO-1/2: reduce-scatter of the gradients, all-gather of the updated weights)", d.Ranks)
		}
		fmt.Fprintf(&b, "optimizer  %s\n", sh)
		if d.ShardWhy != "" {
			fmt.Fprintf(&b, "           %s\n", d.ShardWhy)
		}
		fmt.Fprintf(&b, "interconnect %.0f GB/s all-reduce bus bandwidth; %s of gradients reduced a step\n",
			d.Interconnect/1e9, kernels.FormatBytes(d.GradBytes))
	}
	b.WriteString("\n")

	b.WriteString("placement\n")
	wt := p.Weights.String()
	if p.Weights != TierDevice {
		wt += fmt.Sprintf(" (streamed, prefetch depth %d)", p.PrefetchDepth)
	}
	gt := p.Grads.String()
	if p.Grads == TierHost {
		if p.Accum > 1 && p.Group < p.Accum {
			gt += " (accumulated on the device over each group of micro-batches, sent per layer after it and fetched back for the next)"
		} else {
			gt += " (accumulated on the device, sent per layer once the step's backward is done with it)"
		}
	}
	ot := p.Optimizer.String()
	switch {
	case p.OptimizerSplit() != ot:
		n := p.OptimizerLayers
		var parts []string
		for i, t := range []Tier{TierDevice, TierHost, TierDisk} {
			if n[i] == 0 {
				continue
			}
			how := "AdamW on host"
			if t == TierDevice {
				how = "AdamW on device, with their weights and grads"
			}
			parts = append(parts, fmt.Sprintf("%s for %d layers (%s)", t, n[i], how))
		}
		ot = strings.Join(parts, ", ")
	case p.Optimizer == TierDevice:
		ot += " (AdamW on device)"
	default:
		ot += " (AdamW on host)"
	}
	fmt.Fprintf(&b, "  %-14s %s\n  %-14s %s\n  %-14s %s\n", "weights", wt, "grads", gt, "master+adam", ot)
	if p.OptimizerWhy != "" {
		fmt.Fprintf(&b, "  %-14s %s\n", "", p.OptimizerWhy)
	}
	if p.SpeculativeUpdate {
		fmt.Fprintf(&b, "  %-14s %s\n", "", "host updates speculative: each runs in the backward, into a second copy of its layer's state, and is kept when the step's gradient norm is within the clip (else redone after it)")
	}
	ckpt := ""
	switch {
	case p.Selective && p.CheckpointsOnHost && p.Recompute > 0:
		ckpt = " (selective: attention kept, rest rerun; checkpoints on the host)"
	case p.Selective && p.Recompute > 0:
		ckpt = " (selective: attention kept, rest rerun)"
	case p.CheckpointsOnHost && p.Recompute > 0:
		ckpt = " (checkpoints on the host)"
	}
	fmt.Fprintf(&b, "  %-14s keep %d, offload %d, recompute %d%s\n", "activations", p.Keep, p.Offload, p.Recompute, ckpt)
	for _, n := range p.Notes {
		fmt.Fprintf(&b, "  %-14s %s\n", "", n)
	}
	b.WriteString("\n")

	if p.Data != nil {
		fmt.Fprintf(&b, "memory per rank (peak)  %12s %12s %12s\n", "device", "host", "disk")
	} else {
		fmt.Fprintf(&b, "memory (predicted peak) %12s %12s %12s\n", "device", "host", "disk")
	}
	row := func(name string, f func(u TierUse) int64) {
		fmt.Fprintf(&b, "  %-21s", name)
		for _, u := range p.Memory {
			v := f(u)
			if v == 0 {
				fmt.Fprintf(&b, " %12s", "-")
			} else {
				fmt.Fprintf(&b, " %12s", kernels.FormatBytes(v))
			}
		}
		b.WriteString("\n")
	}
	for _, c := range Classes() {
		row(c.String(), func(u TierUse) int64 { return u.ByClass[c] })
	}
	row("reserve+slack", func(u TierUse) int64 { return u.Reserve + u.Slack })
	row("total", func(u TierUse) int64 { return u.Peak })
	row("budget", func(u TierUse) int64 { return u.Budget })
	if d := p.Data; d != nil {
		node := []int64{0, d.NodeHost, d.NodeDisk}
		i := 0
		row(fmt.Sprintf("node budget (/%d)", d.LocalRanks), func(u TierUse) int64 { i++; return node[i-1] })
	}
	b.WriteString("\n")

	fmt.Fprintf(&b, "time per step (predicted)\n")
	all := ""
	if p.Data != nil {
		all = ", all ranks"
	}
	fmt.Fprintf(&b, "  %-21s %9.3f s  (%.0f tokens/s%s)\n", "step", p.StepTime, p.TokensPerSec, all)
	for _, r := range []struct {
		name string
		v    float64
	}{{"compute", p.Busy.Compute}, {"h2d", p.Busy.H2D}, {"d2h", p.Busy.D2H},
		{"host optimizer", p.Busy.HostOptimizer}, {"disk", p.Busy.Disk}} {
		fmt.Fprintf(&b, "  %-21s %9.3f s busy\n", r.name, r.v)
	}
	if p.Data != nil {
		fmt.Fprintf(&b, "  %-21s %9.3f s busy, %.3f s not hidden by the backward\n", "comm (all-reduce)", p.Busy.Comm, p.Data.CommExposed)
	}
	fmt.Fprintf(&b, "  %-21s %s\n\n", "bottleneck", p.Bottleneck)

	if len(p.Alternatives) > 0 {
		b.WriteString("why not\n")
		for _, a := range p.Alternatives {
			fmt.Fprintf(&b, "  %s: %.3f s predicted; %s\n    %s\n", a.Family, a.StepTime, a.Why, a.Summary)
		}
		b.WriteString("\n")
	}

	b.WriteString("layers\n")
	pw := 15 // the policy column
	for _, l := range p.Layers {
		pw = max(pw, len(l.Policy.String()))
	}
	for i := 0; i < len(p.Layers); {
		j := i
		for j+1 < len(p.Layers) && p.Layers[j+1].Policy == p.Layers[i].Policy && p.Layers[j+1].Optimizer == p.Layers[i].Optimizer &&
			strings.HasPrefix(p.Layers[j+1].Name, "block ") && strings.HasPrefix(p.Layers[i].Name, "block ") {
			j++
		}
		name := p.Layers[i].Name
		if j > i {
			name += " - " + strings.TrimPrefix(p.Layers[j].Name, "block ")
		}
		fmt.Fprintf(&b, "  %-21s %-*s optimizer on %s\n", name, pw, p.Layers[i].Policy, p.Layers[i].Optimizer)
		i = j + 1
	}
	_, err := io.WriteString(w, b.String())
	return err
}
