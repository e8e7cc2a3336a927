package plan

import (
	"fmt"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/schedule"
)

// The split of the optimizer state. An out-of-core candidate keeps the
// optimizer state (fp32 master and Adam moments) of its first nDev layers
// on the device, of its last nDisk layers on disk and of the others on
// the host. That order is the one the step's time asks for: the host
// optimizer updates a layer once its gradients are final, which the
// backward makes true from the last layer to the first, and the next
// forward needs the first layers first; so the first layers' host updates
// are the ones nothing hides, and they are the ones the device takes
// (the device AdamW runs at device memory speed), while the last layers'
// updates have the rest of the backward and the next forward to hide
// behind, and they are the ones that can wait for the disk.
//
// nDev is as many layers as the device has room for, counted with an
// upper bound of what each layer adds to the device peak: its master and
// moments and, when its weights or gradients stream, a resident copy of
// them (with resident weights and gradients the bound is exact: the
// persistent blocks add to every moment of the program alike). nDisk is
// as few layers as make the host fit its budget.

// optTiers is the optimizer tier of every layer of c (nil for the
// resident trainer).
func (pl *planner) optTiers(c *cand) []offload.Tier {
	if c.o == offload.TierDevice {
		return nil
	}
	n := len(pl.m.Layers)
	t := make([]offload.Tier, n)
	for i := range t {
		switch {
		case i < c.nDev:
			t[i] = offload.TierDevice
		case i >= n-c.nDisk:
			t[i] = offload.TierDisk
		default:
			t[i] = offload.TierHost
		}
	}
	return t
}

// devAdd is at most what moving layer l's optimizer state to the device
// adds to c's device peak.
func (pl *planner) devAdd(c *cand, l int) int64 {
	sh := pl.shape(c.mb)[l]
	n := 2 * schedule.RoundBlock(sh.MomentBytes)
	if sh.MasterBytes > 0 {
		n += schedule.RoundBlock(sh.MasterBytes)
	}
	if c.w != offload.TierDevice {
		n += schedule.RoundBlock(sh.ParamBytes)
	}
	if c.g != offload.TierDevice {
		n += schedule.RoundBlock(sh.ParamBytes)
	}
	return n
}

// maxDev is how many of the first layers of c can keep their optimizer
// state on the device when c's device peak without any is base: at most
// all layers but one (all of them is the resident trainer), none with a
// delayed update or a pinned optimizer tier.
func (pl *planner) maxDev(c *cand, base int64) int {
	if c.o == offload.TierDevice || pl.req.DelayedUpdate || pl.req.Optimizer != 0 {
		return 0
	}
	room := pl.req.Budgets.Device - pl.hw.DeviceReserve - base
	limit := len(pl.m.Layers) - 1
	if m := pl.req.MaxDeviceOptimizerLayers; m > 0 {
		limit = min(limit, m)
	}
	k := 0
	for k < limit {
		a := pl.devAdd(c, k)
		if a > room {
			break
		}
		room -= a
		k++
	}
	return k
}

// devAddAll is what c's first nDev layers add at most.
func (pl *planner) devAddAll(c *cand) int64 {
	var n int64
	for l := 0; l < c.nDev; l++ {
		n += pl.devAdd(c, l)
	}
	return n
}

// optimizerWhy says why c's optimizer state is split as it is.
func (pl *planner) optimizerWhy(c *cand) string {
	n := len(pl.m.Layers)
	host := n - c.nDev - c.nDisk
	var params [3]int64
	for i, t := range pl.optTiers(c) {
		np := pl.m.Layers[i].Params
		if t == offload.TierHost {
			np = ShardParams(np, pl.shard) // a rank's
		}
		params[t-offload.TierDevice] += np
	}
	bytes := func(np int64) string { return kernels.FormatBytes(np * (8 + pl.masterBytes())) }
	s := ""
	switch {
	case pl.req.Optimizer == offload.TierHost && c.nDisk > 0:
		return fmt.Sprintf("none on the device, as pinned; %d layers on the host, the last %d layers' on disk: without, the host would be short", n-c.nDisk, c.nDisk)
	case pl.req.Optimizer != 0:
		return fmt.Sprintf("every layer's on %s, as pinned", pl.req.Optimizer)
	case pl.req.DelayedUpdate:
		s = "none on the device: a delayed update runs on the host"
	case c.nDev == 0:
		s = "none on the device: it has no room left after the weights, gradients and activations"
	case c.nDev == n-1:
		s = fmt.Sprintf("layers 0-%d (%s) on the device, updated by its AdamW; one layer stays off it (all of it is the resident trainer)",
			c.nDev-1, bytes(params[0]))
	default:
		s = fmt.Sprintf("layers 0-%d (%s) on the device, updated by its AdamW, as many as its room after the weights, gradients and activations holds; their host updates would be the least hidden",
			c.nDev-1, bytes(params[0]))
	}
	if host > 0 {
		s += fmt.Sprintf("; %d layers (%s) on the host", host, bytes(params[1]))
	}
	if c.nDisk > 0 {
		what, per := "moments", int64(8)
		if c.mdisk {
			what, per = "master weights and moments", 12
		}
		s += fmt.Sprintf("; the last %d layers' %s (%s) on disk, read ahead and written back around the host AdamW: without, the host would be short", c.nDisk,
			what, kernels.FormatBytes(per*params[2]))
	}
	return s
}
