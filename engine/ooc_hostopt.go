package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/stream"
)

// The host optimizer of the out-of-core trainer: each layer's AdamW on
// its host state, queued as its gradients land, and the waits on it.

// waitUpdates waits for every layer's update and for the disk tier's
// write-backs.
func (hs *hostState) waitUpdates() error {
	var errs []error
	for i := range hs.host {
		if err := hs.waitLayer(context.Background(), i); err != nil {
			errs = append(errs, err)
		}
		h := &hs.host[i]
		<-h.stored
		if h.storeErr != nil && !errors.Is(h.err, h.storeErr) {
			errs = append(errs, h.storeErr)
		}
	}
	return errors.Join(errs...)
}

// waitLayer waits for layer i's update and makes the weights it wrote
// (DelayedUpdate) the ones fetches read. It runs on the goroutine that
// drives the trainer.
func (hs *hostState) waitLayer(ctx context.Context, i int) error {
	h := &hs.host[i]
	select {
	case <-h.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	h.applyKeep()
	if h.next != nil {
		h.weights, h.spareW, h.next = h.next, h.weights, nil
		k := offload.Key{Layer: i, Class: offload.Weights}
		if r, _ := hs.table.Get(k); r.Valid.Has(offload.TierDevice) {
			_ = hs.table.Modified(k, offload.TierHost) // the device copy is stale
		}
	}
	return h.err
}

// applyKeep makes the second copy the layer's state when its finished
// speculative update was kept (settleSpec).
func (h *hostLayer) applyKeep() {
	if !h.keep {
		return
	}
	h.keep = false
	h.master, h.sMaster = h.sMaster, h.master
	h.m, h.sM = h.sM, h.m
	h.v, h.sV = h.sV, h.v
	h.weights, h.sWeights = h.sWeights, h.weights
}

// launchUpdate queues the host optimizer of layer i with hp, after the
// layer's previous update; the next fetch of its weights waits for it.
// eager updates wait for the copy of the gradients to the host and skip a
// layer whose gradients are not finite. With DelayedUpdate the update
// writes the spare weights buffer and the next evictions land in the
// spare gradients buffer.
func (hs *hostState) launchUpdate(ctx context.Context, i int, hp kernels.AdamWParams, eager bool) {
	if hs.tier[i] == offload.TierDevice {
		return // updateDevice
	}
	h := &hs.host[i]
	<-h.done
	h.applyKeep()
	grads, out := h.grads, h.weights
	switch {
	case hs.opts.DelayedUpdate:
		out, h.next = h.spareW, h.spareW
		h.spareW = nil
		h.grads, h.spareG = h.spareG, h.grads
	case hs.m.DType == kernels.F32:
		out = nil // the weights are the master (whole, also when sharded)
	}
	done := make(chan struct{})
	h.done, h.err, h.nonFinite = done, nil, false
	// The update writes the master, the moments and (in place, or with
	// DelayedUpdate once waitLayer swaps the buffers) the weights on the
	// host: any device copy of the weights is stale. What is on disk is
	// the disk pipeline's to record (its last write-back may still be in
	// flight).
	classes := []offload.Class{offload.Weights, offload.Master, offload.AdamM, offload.AdamV}
	if hs.tier[i] == offload.TierDisk {
		classes = classes[:4-len(hs.diskKeys(i))]
	}
	for _, cl := range classes {
		k := offload.Key{Layer: i, Class: cl}
		if r, _ := hs.table.Get(k); r.Valid.Has(offload.TierHost) {
			hs.recErr(hs.table.Modified(k, offload.TierHost))
		}
	}
	gradEv := h.gradEv
	if hs.tier[i] == offload.TierDisk {
		// Read the moments ahead, while the updates queued before run.
		h.loaded = make(chan struct{})
		hs.ahead <- i
	}
	hs.work <- func() {
		defer close(done)
		if eager && gradEv != nil {
			if h.err = gradEv.Synchronize(ctx); h.err != nil {
				hs.skipLoaded(i)
				return
			}
			if !offload.HostFinite(grads, hs.m.DType) {
				h.nonFinite = true
				hs.skipLoaded(i)
				return
			}
		}
		end := hs.rec.Begin("optimizer", stream.Optimizer, "adamw "+hs.m.Layers[i].Name())
		h.err = hs.updateLayer(ctx, i, hp, grads, out)
		end()
	}
}

// launchSpec queues the speculative update of host layer i with hp (the
// step's update if its gradients are not clipped): once the layer's final
// gradients have landed, AdamW from its state into its second copy
// (hostLayer.sMaster, sWeights, sM, sV), leaving the state unchanged.
// settleSpec then keeps or drops it. Non-finite gradients need no check:
// they skip the step, which drops the update.
func (hs *hostState) launchSpec(ctx context.Context, i int, hp kernels.AdamWParams) {
	h := &hs.host[i]
	<-h.done
	h.applyKeep()
	done := make(chan struct{})
	h.done, h.err, h.spec = done, nil, true
	gradEv, grads := h.gradEv, h.grads
	src, dst := [3][]byte{h.master, h.m, h.v}, [3][]byte{h.sMaster, h.sM, h.sV}
	out := h.sWeights
	if hs.m.DType == kernels.F32 {
		out = nil // the master is the weights
	}
	hs.work <- func() {
		defer close(done)
		if gradEv != nil {
			if h.err = gradEv.Synchronize(ctx); h.err != nil {
				return
			}
		}
		end := hs.rec.Begin("optimizer", stream.Optimizer, "adamw (speculative) "+hs.m.Layers[i].Name())
		h.err = hs.adamParams(i, hp, grads, dst, &src, out)
		end()
	}
}

// settleSpec ends the running step's speculative updates: with keep each
// one becomes its layer's state once it is waited for (waitLayer), and
// the device copies of the layer's weights are stale; else it is dropped
// (its copy is simply overwritten by the next): the layers whose
// hostLayer.keep it sets need no other update this step.
func (hs *hostState) settleSpec(keep bool) {
	for i := range hs.host {
		h := &hs.host[i]
		if !h.spec {
			continue
		}
		h.spec = false
		if !keep {
			hs.specDropped++
			continue
		}
		hs.specKept++
		h.keep = true
		for _, cl := range []offload.Class{offload.Weights, offload.Master, offload.AdamM, offload.AdamV} {
			k := offload.Key{Layer: i, Class: cl}
			if r, _ := hs.table.Get(k); r.Valid.Has(offload.TierHost) {
				hs.recErr(hs.table.Modified(k, offload.TierHost))
			}
		}
	}
}

// updateLayer is AdamW on layer i's host state with gradients grads,
// writing the compute-dtype weights to out (nil: the master is the
// compute copy). A layer on the disk tier updates the moments its
// read-ahead loaded and queues their write-back.
func (hs *hostState) updateLayer(ctx context.Context, i int, hp kernels.AdamWParams, grads, out []byte) error {
	h := &hs.host[i]
	l := hs.m.Layers[i]
	mb, vb, wb := h.m, h.v, h.master
	np := int64(l.NumParams())
	if hs.tier[i] == offload.TierDisk {
		<-h.loaded
		if h.loadErr != nil {
			hs.releaseLoaded(i)
			return fmt.Errorf("engine: host optimizer, layer %s: %w", l.Name(), h.loadErr)
		}
		mb, vb = h.buf.m[:4*np], h.buf.v[:4*np]
		if hs.mdisk {
			wb = h.buf.master[:4*np]
		}
	}
	if err := hs.adamParams(i, hp, grads, [3][]byte{wb, mb, vb}, nil, out); err != nil {
		if hs.tier[i] == offload.TierDisk {
			hs.releaseLoaded(i)
		}
		return err
	}
	if hs.tier[i] == offload.TierDisk {
		hs.writeBack(ctx, i)
	}
	return nil
}

// adamParams is AdamW over each parameter of layer i (weight decay on the
// decayed ones) with gradients grads: on st (master, m, v) in place, or,
// when src is not nil, from src into st (the speculative update), writing
// the compute-dtype weights to out (nil: the master is the compute copy).
// The moments hold [s0, s1) of the layer's parameters: the rank's range
// when sharded (engine/zero.go), else all; the master the same from m0
// on, or all of them (fp32: the master is the weights).
func (hs *hostState) adamParams(i int, hp kernels.AdamWParams, grads []byte, st [3][]byte, src *[3][]byte, out []byte) error {
	l := hs.m.Layers[i]
	dt := hs.m.DType
	np := l.NumParams()
	master, m, v := offload.F32s(st[0]), offload.F32s(st[1]), offload.F32s(st[2])
	es := int(dt.Size())
	s0, s1 := hs.opts.shardOf(i, np)
	m0, _ := hs.opts.masterOf(dt, i, np)
	for _, ps := range l.Params() {
		p := hp
		if !ps.Decay {
			p.WeightDecay = 0
		}
		lo, hi := max(ps.Offset, s0), min(ps.Offset+ps.Elems(), s1)
		if lo >= hi {
			continue
		}
		var o []byte
		if out != nil {
			o = out[lo*es : hi*es]
		}
		pm, mm, vm, g := master[lo-m0:hi-m0], m[lo-s0:hi-s0], v[lo-s0:hi-s0], grads[lo*es:hi*es]
		var err error
		if src == nil {
			err = offload.HostAdamW(pm, g, dt, mm, vm, o, dt, p)
		} else {
			sp, sm, sv := offload.F32s(src[0]), offload.F32s(src[1]), offload.F32s(src[2])
			err = offload.HostAdamWFrom(pm, mm, vm, sp[lo-m0:hi-m0], sm[lo-s0:hi-s0], sv[lo-s0:hi-s0], g, dt, o, dt, p)
		}
		if err != nil {
			return fmt.Errorf("engine: host optimizer, layer %s: %w", l.Name(), err)
		}
	}
	return nil
}
