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
	if h.next != nil {
		h.weights, h.spareW, h.next = h.next, h.weights, nil
		k := offload.Key{Layer: i, Class: offload.Weights}
		if r, _ := hs.table.Get(k); r.Valid.Has(offload.TierDevice) {
			_ = hs.table.Modified(k, offload.TierHost) // the device copy is stale
		}
	}
	return h.err
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

// updateLayer is AdamW on layer i's host state with gradients grads,
// writing the compute-dtype weights to out (nil: the master is the
// compute copy). A layer on the disk tier updates the moments its
// read-ahead loaded and queues their write-back.
func (hs *hostState) updateLayer(ctx context.Context, i int, hp kernels.AdamWParams, grads, out []byte) error {
	h := &hs.host[i]
	l := hs.m.Layers[i]
	dt := hs.m.DType
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
	master, m, v := offload.F32s(wb), offload.F32s(mb), offload.F32s(vb)
	es := int(dt.Size())
	// The moments hold [s0, s1) of the layer's parameters: the rank's
	// range when sharded (engine/zero.go), else all; the master the same
	// from m0 on, or all of them (fp32: the master is the weights).
	s0, s1 := hs.opts.shardOf(i, int(np))
	m0, _ := hs.opts.masterOf(dt, i, int(np))
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
		if err := offload.HostAdamW(master[lo-m0:hi-m0], grads[lo*es:hi*es], dt, m[lo-s0:hi-s0], v[lo-s0:hi-s0], o, dt, p); err != nil {
			if hs.tier[i] == offload.TierDisk {
				hs.releaseLoaded(i)
			}
			return err
		}
	}
	if hs.tier[i] == offload.TierDisk {
		hs.writeBack(ctx, i)
	}
	return nil
}
