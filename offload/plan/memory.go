package plan

import (
	"maps"

	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/schedule"
)

// The memory side of the planner: the exact device peak of a candidate
// (by compiling its program), the host and disk state of a placement, and
// the optimizer split between the tiers.

// devicePeak is the exact device memory of c by class.
func (pl *planner) devicePeak(c *cand) (int64, map[offload.Class]int64, error) {
	if c.o == offload.TierDevice {
		var by map[offload.Class]int64
		if pl.m.Resident != nil {
			by = pl.m.Resident(c.mb)
		} else {
			by = map[offload.Class]int64{}
			var acts, sc int64
			for _, l := range pl.m.Layers {
				acts += l.ActBytes * int64(c.mb)
				sc = max(sc, l.ScratchBytes*int64(c.mb))
			}
			by[offload.Weights] = pl.s * pl.P
			by[offload.Grads] = pl.s * pl.P
			if pl.m.Precision.Mixed() {
				by[offload.Master] = 4 * pl.P
			}
			by[offload.AdamM], by[offload.AdamV] = 4*pl.P, 4*pl.P
			by[offload.Activations] = acts
			by[offload.Workspace] = sc
		}
		if cb := pl.commBytes(nil); cb > 0 {
			by = maps.Clone(by)
			by[offload.Workspace] += cb
		}
		var n int64
		for _, v := range by {
			n += v
		}
		return n, by, nil
	}
	k := peakKey{c.w, c.g, c.mb, c.grp, c.depth, c.rec, c.off, c.nDev, c.nDisk, c.ckptHost, c.sel}
	if v, ok := pl.peakCache[k]; ok {
		return v.peak, v.by, v.err
	}
	accum := pl.req.Batch / c.mb
	tp, tby, _, err := schedule.PeakOf(pl.spec(c))
	var v peakVal
	if err == nil {
		ev := pl.spec(c)
		ev.MicroBatches, ev.Group, ev.Acts, ev.Train = 1, 1, nil, false
		var ep int64
		var eby map[offload.Class]int64
		ep, eby, _, err = schedule.PeakOf(ev)
		if ep > tp {
			tp, tby = ep, eby
		}
		fx := pl.fixed(c.mb, accum) + pl.commBytes(pl.optTiers(c))
		tby[offload.Workspace] += fx
		v = peakVal{peak: tp + fx, by: tby, err: err}
	} else {
		v.err = err
	}
	pl.peakCache[k] = v
	return v.peak, v.by, v.err
}

// DiskBuffers is how many layers' optimizer state the disk tier holds in
// host memory at once: one read ahead, one being updated, two being
// written back. The trainer allocates min(DiskBuffers, layers on disk)
// buffers, each of the largest disk layer's size, with the rest of the
// host state (HostState counts them).
const DiskBuffers = 4

// CanMasterOnDisk says whether the layers whose optimizer state is on
// disk may keep their fp32 master weights there too, read ahead and
// written back with the moments: when the master is a buffer of its own
// (mixed precision, or a delayed update, which updates a second copy of
// the weights). In fp32 without a delayed update the master is the
// compute-dtype copy that the fetches read: it stays on the host, and
// moving it would save no host memory.
func CanMasterOnDisk(mixed, delayed bool) bool { return mixed || delayed }

// HostState is the host memory an out-of-core trainer holds for the
// layers' state, by class: per layer whose optimizer state is not on the
// device (optimizer[i], nil: all on the host) the fp32 master unless the
// layer's is on disk (masterDisk: the disk layers' masters are there,
// which CanMasterOnDisk must allow), the compute-dtype weights fetches read (the
// master itself in fp32 without a delayed update), the gradients' landing
// buffer, the Adam moments unless they are on disk, and with a delayed
// update a second copy of the weights and of the gradients; nothing for a
// layer updated on the device. The disk tier's buffers (DiskBuffers of
// the largest disk layer's moments and, on disk, master) are counted
// under their classes. slots are the host slots of the program
// (offloaded activations, tied gradients), by class.
func HostState(params []int64, elem int64, mixed, delayed, masterDisk bool, optimizer []offload.Tier, slots map[offload.Class]int64) map[offload.Class]int64 {
	return HostStateRanks(params, elem, mixed, delayed, masterDisk, optimizer, slots, 1)
}

// HostStateRanks is HostState of one of shard ranks the optimizer state
// is sharded across (ranks.go): the moments of a layer whose optimizer
// state is on the host, and its master when it is a buffer of its own
// (mixed or delayed), are ShardParams of its parameters. In fp32 the
// master is the whole weights buffer every rank needs. Layers updated on
// the device or the disk tier are not sharded (the engine's layout).
func HostStateRanks(params []int64, elem int64, mixed, delayed, masterDisk bool, optimizer []offload.Tier, slots map[offload.Class]int64, shard int) map[offload.Class]int64 {
	by := map[offload.Class]int64{}
	var ndisk int
	var maxDisk int64
	for i, np := range params {
		tier := offload.TierHost
		if optimizer != nil {
			tier = optimizer[i]
		}
		if tier == offload.TierDevice {
			continue
		}
		cb := np * elem
		op := np
		if tier == offload.TierHost {
			op = ShardParams(np, shard)
		}
		if tier != offload.TierDisk || !masterDisk {
			if mixed || delayed {
				by[offload.Master] += 4 * op
			} else {
				by[offload.Master] += 4 * np // the weights themselves
			}
		}
		if mixed || delayed {
			by[offload.Weights] += cb
		}
		by[offload.Grads] += cb
		if delayed {
			by[offload.Weights] += cb
			by[offload.Grads] += cb
		}
		if tier != offload.TierDisk {
			by[offload.AdamM] += 4 * op
			by[offload.AdamV] += 4 * op
		} else {
			ndisk++
			maxDisk = max(maxDisk, op)
		}
	}
	if nb := int64(min(ndisk, DiskBuffers)); nb > 0 {
		by[offload.AdamM] += nb * 4 * maxDisk
		by[offload.AdamV] += nb * 4 * maxDisk
		if masterDisk {
			by[offload.Master] += nb * 4 * maxDisk
		}
	}
	for c, n := range slots {
		by[c] += n
	}
	for k, v := range by {
		if v == 0 {
			delete(by, k)
		}
	}
	return by
}

// SpecState is the host memory of the speculative update's second copy
// of the state of each layer whose optimizer state is on the host (in
// RAM; optimizer nil: every layer's), by class: its fp32 master, its
// compute-dtype weights when those are a buffer of their own (mixed
// precision; in fp32 the master is the weights) and its moments. The
// speculative update (Placement.SpeculativeUpdate) writes a layer's
// update there during the backward, before the step's gradient norm is
// known, and keeps it when the gradients are not clipped.
func SpecState(params []int64, elem int64, mixed bool, optimizer []offload.Tier) map[offload.Class]int64 {
	by := map[offload.Class]int64{}
	for i, np := range params {
		if optimizer != nil && optimizer[i] != offload.TierHost {
			continue
		}
		by[offload.Master] += 4 * np
		if mixed {
			by[offload.Weights] += elem * np
		}
		by[offload.AdamM] += 4 * np
		by[offload.AdamV] += 4 * np
	}
	return by
}

// canSpec reports whether c may update speculatively: the host updates
// wait for the global norm, none is delayed or sharded, and no layer's
// optimizer state is on disk.
func (pl *planner) canSpec(c *cand) bool {
	return pl.req.GlobalNorm && !pl.req.DelayedUpdate && !pl.req.NoSpeculation && !c.noSpec && c.o == offload.TierHost && c.nDisk == 0 &&
		!pl.anySharded(pl.optTiers(c))
}

// DiskState is what the disk tier holds for the layers whose optimizer
// state is on disk, by class: their moments and, with masterDisk, their
// master weights (whole on every rank: the disk tier is not sharded).
func DiskState(params []int64, masterDisk bool, optimizer []offload.Tier) map[offload.Class]int64 {
	by := map[offload.Class]int64{}
	for i, np := range params {
		if optimizer == nil || optimizer[i] != offload.TierDisk {
			continue
		}
		by[offload.AdamM] += 4 * np
		by[offload.AdamV] += 4 * np
		if masterDisk {
			by[offload.Master] += 4 * np
		}
	}
	return by
}

// SlotBytes is the host memory of a program's slots by class, each
// rounded up to whole float32 words as the trainer allocates them.
func SlotBytes(p *schedule.Program) map[offload.Class]int64 {
	by := map[offload.Class]int64{}
	counted := make([]bool, len(p.HostSlots))
	for _, iv := range p.Intervals {
		if iv.Slot >= 0 && !counted[iv.Slot] {
			counted[iv.Slot] = true
			by[iv.Class.Offload()] += 4 * ((p.HostSlots[iv.Slot] + 3) / 4)
		}
	}
	return by
}

// hostDisk fills c's host and disk bytes by class. With the optimizer on
// disk it first chooses nDisk: as few of the last layers as make the host
// fit its budget (all that are not on the device when even that is not
// enough, or when the optimizer is pinned to disk).
func (pl *planner) hostDisk(c *cand) {
	c.host, c.disk = [offload.NumClasses]int64{}, [offload.NumClasses]int64{}
	if c.o == offload.TierDevice {
		return
	}
	n := len(pl.m.Layers)
	params := make([]int64, n)
	for i, l := range pl.m.Layers {
		params[i] = l.Params
	}
	// Slots without compiling: an offloaded layer keeps one per
	// micro-batch of a group, a tied layer's gradients one when they are
	// streamed and leave between runs.
	slots := map[offload.Class]int64{}
	sh := pl.shape(c.mb)
	for j, i := range pl.rec {
		switch {
		case j < c.rec && c.ckptHost:
			slots[offload.Activations] += int64(c.grp) * 4 * ((ckptBytes(sh[i], c.sel) + 3) / 4)
		case j >= c.rec && j < c.rec+c.off:
			slots[offload.Activations] += int64(c.grp) * 4 * ((sh[i].ActBytes + 3) / 4)
		}
	}
	if c.g == offload.TierHost {
		for _, l := range sh {
			for _, t := range l.Tied {
				slots[offload.Grads] += 4 * ((sh[t].ParamBytes + 3) / 4)
			}
		}
	}
	// As few of the last layers on disk as make the host fit (the disk
	// tier's buffers make the first few save less than their state),
	// counted incrementally from HostState's figure with none on disk.
	mixed := pl.m.Precision.Mixed()
	c.nDisk = 0
	if c.o == offload.TierDisk {
		total := pl.req.HostExtra
		for _, v := range HostStateRanks(params, pl.s, mixed, pl.req.DelayedUpdate, c.mdisk, pl.optTiers(c), slots, pl.shard) {
			total += v
		}
		per := int64(8) // bytes a parameter of a disk layer's buffers
		if c.mdisk {
			per = 12
		}
		var maxDisk int64
		for c.nDisk < n-c.nDev && (pl.req.Optimizer == offload.TierDisk || total+pl.hw.HostReserve > pl.req.Budgets.Host) {
			np := params[n-1-c.nDisk]
			total -= per * ShardParams(np, pl.shard) // its host state, sharded or not
			total -= int64(min(c.nDisk, DiskBuffers)) * per * maxDisk
			c.nDisk++
			maxDisk = max(maxDisk, np) // the disk tier's buffers are whole
			total += int64(min(c.nDisk, DiskBuffers)) * per * maxDisk
		}
	}
	by := HostStateRanks(params, pl.s, mixed, pl.req.DelayedUpdate, c.mdisk, pl.optTiers(c), slots, pl.shard)
	// The speculative update's second copy, when the host has room for
	// it after everything else.
	c.spec = false
	if pl.canSpec(c) {
		total := pl.req.HostExtra + pl.hw.HostReserve
		for _, v := range by {
			total += v
		}
		extra := SpecState(params, pl.s, mixed, pl.optTiers(c))
		for _, v := range extra {
			total += v
		}
		if total <= pl.req.Budgets.Host {
			c.spec = true
			for cl, v := range extra {
				by[cl] += v
			}
		}
	}
	for cl, v := range DiskState(params, c.mdisk, pl.optTiers(c)) {
		c.disk[cl] = v
	}
	for cl, v := range by {
		c.host[cl] = v
	}
	c.host[offload.Workspace] += pl.req.HostExtra
}

// estimate is a quick upper-ish estimate of c's device bytes, to skip
// compiling candidates far over budget.
func (pl *planner) estimate(c *cand) int64 {
	if c.o == offload.TierDevice {
		n, _, _ := pl.devicePeak(c)
		return n
	}
	sh := pl.shape(c.mb)
	var w, acts, last, maxAct, out, save int64
	for i, l := range sh {
		w = max(w, l.ParamBytes)
		pol := offload.Keep
		if j := indexOf(pl.rec, i); j >= 0 {
			switch {
			case j < c.rec:
				pol = offload.Recompute
			case j < c.rec+c.off:
				pol = offload.OffloadTo
			}
		}
		maxAct = max(maxAct, l.ActBytes)
		out = max(out, l.OutBytes)
		switch {
		case pol == offload.Keep && i == len(sh)-1:
			// The last layer turns each micro-batch around at once
			// (schedule): one micro-batch's activations, not a group's.
			last = l.ActBytes
		case pol == offload.Keep:
			acts += l.ActBytes
		case pol == offload.Recompute && c.sel:
			// A selective checkpoint, on the device or on its way back
			// from the host for the group's recomputes.
			save = max(save, l.SaveBytes)
			if !c.ckptHost {
				acts += l.SaveBytes
			}
		case pol == offload.Recompute:
			if !c.ckptHost {
				acts += l.OutBytes
			}
		}
	}
	n := int64(c.grp)*acts + last + 2*maxAct + 2*int64(c.grp)*max(out, save)
	if c.w == offload.TierDevice {
		n += pl.s * pl.P
	} else {
		n += int64(c.depth+1) * w
	}
	if c.g == offload.TierDevice {
		n += pl.s * pl.P
	} else {
		n += 2 * w
	}
	return n + pl.fixed(c.mb, pl.req.Batch/c.mb) + pl.devAddAll(c)
}

func indexOf(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func (pl *planner) masterBytes() int64 {
	if pl.m.Precision.Mixed() {
		return 4
	}
	return 0
}
