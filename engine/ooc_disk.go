package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/stream"
)

// The disk tier's pipeline of the host state: optimizer state of disk
// layers read ahead before their updates and written back after them.

// readAhead is the disk tier's reader: for each layer queued, in the
// order the updates are queued, it takes a free buffer (at most
// diskBuffers layers' state is in host memory), waits for the layer's
// last write-back, and loads the moments (and the master), so that the
// next layers' reads overlap the current update.
func (hs *hostState) readAhead(ahead <-chan int) {
	for i := range ahead {
		h := &hs.host[i]
		h.buf, h.loadErr = nil, nil
		<-h.stored
		hs.diskMu.Lock()
		h.loadErr = hs.diskErr
		hs.diskMu.Unlock()
		if h.loadErr != nil {
			// A write-back failed: the files are not to be trusted (the
			// run stops; the last checkpoint is intact).
			close(h.loaded)
			continue
		}
		h.buf = <-hs.bufs
		np := int64(hs.m.Layers[i].NumParams())
		keys, bufs := hs.diskKeys(i), hs.diskSlices(h.buf, np)
		t := hs.table
		ctx := context.Background()
		end := hs.rec.Begin("disk", stream.Optimizer, "read "+hs.m.Layers[i].Name())
		var ops []*offload.Op
		for j, k := range keys {
			hs.recErr(t.BeginCopy(k, offload.TierDisk, offload.TierHost))
			ops = append(ops, hs.disk.Load(ctx, k, bufs[j]))
		}
		for _, op := range ops {
			h.loadErr = errors.Join(h.loadErr, op.Wait(ctx))
		}
		end()
		for _, k := range keys {
			if h.loadErr != nil {
				hs.recErr(t.AbortCopy(k))
			} else {
				hs.recErr(t.EndCopy(k))
			}
		}
		if h.loadErr == nil {
			hs.countDisk(4 * np * int64(len(keys)))
		}
		close(h.loaded)
	}
}

// skipLoaded drops the moments read ahead for an update that does not
// run (the moments on disk are unchanged).
func (hs *hostState) skipLoaded(i int) {
	if hs.tier[i] != offload.TierDisk {
		return
	}
	<-hs.host[i].loaded
	if hs.host[i].loadErr == nil {
		for _, k := range hs.diskKeys(i) {
			hs.recErr(hs.table.Evict(k, offload.TierHost))
		}
	}
	hs.releaseLoaded(i)
}

// releaseLoaded returns layer i's read-ahead buffer to the pool.
func (hs *hostState) releaseLoaded(i int) {
	h := &hs.host[i]
	if h.buf != nil {
		hs.bufs <- h.buf
		h.buf = nil
	}
}

// writeBack queues the store of layer i's updated moments (and master) to
// the disk tier and returns: their buffer goes back to the pool, and the
// table records them on disk only, once every write has landed. A failed
// write is the layer's storeErr (reported by waitUpdates and by the
// layer's next update) and poisons the tier's files for every later read.
func (hs *hostState) writeBack(ctx context.Context, i int) {
	h := &hs.host[i]
	np := int64(hs.m.Layers[i].NumParams())
	buf := h.buf
	h.buf = nil
	keys, bufs := hs.diskKeys(i), hs.diskSlices(buf, np)
	t := hs.table
	for _, k := range keys {
		hs.recErr(errors.Join(t.Modified(k, offload.TierHost), t.BeginCopy(k, offload.TierHost, offload.TierDisk)))
	}
	stored := make(chan struct{})
	h.stored, h.storeErr = stored, nil
	var ops []*offload.Op
	for j, k := range keys {
		ops = append(ops, hs.diskStore(ctx, k, bufs[j]))
	}
	go func() {
		defer close(stored)
		var err error
		for _, op := range ops {
			err = errors.Join(err, op.Wait(context.Background()))
		}
		for _, k := range keys {
			if err != nil {
				// The file may be torn, and the host copy goes back to
				// the pool: the layer's moments are lost to this run.
				hs.recErr(t.AbortCopy(k))
				continue
			}
			hs.recErr(errors.Join(t.EndCopy(k), t.Evict(k, offload.TierHost)))
		}
		hs.bufs <- buf
		if err != nil {
			h.storeErr = fmt.Errorf("engine: host optimizer, layer %s: writing back its optimizer state: %w", hs.m.Layers[i].Name(), err)
			hs.diskMu.Lock()
			if hs.diskErr == nil {
				hs.diskErr = h.storeErr
			}
			hs.diskMu.Unlock()
			return
		}
		hs.countDisk(4 * np * int64(len(keys)))
	}()
}

// diskKeys are the tensors of layer i on the disk tier: its moments and,
// with DiskMaster, its master.
func (hs *hostState) diskKeys(i int) []offload.Key {
	k := []offload.Key{{Layer: i, Class: offload.AdamM}, {Layer: i, Class: offload.AdamV}}
	if hs.mdisk {
		k = append(k, offload.Key{Layer: i, Class: offload.Master})
	}
	return k
}

// diskSlices are buf's slices for a layer of np parameters, in the order
// of diskKeys.
func (hs *hostState) diskSlices(buf *diskBuf, np int64) [][]byte {
	b := [][]byte{buf.m[:4*np], buf.v[:4*np]}
	if hs.mdisk {
		b = append(b, buf.master[:4*np])
	}
	return b
}

func (hs *hostState) countDisk(n int64) {
	hs.mu.Lock()
	hs.diskRW += n
	hs.mu.Unlock()
}

// diskBytes is what the disk tier has read and written so far.
func (hs *hostState) diskBytes() int64 {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.diskRW
}

// diskStore starts writing an optimizer file of the disk tier (through
// storeHook when a test sets one).
func (hs *hostState) diskStore(ctx context.Context, k offload.Key, b []byte) *offload.Op {
	if hs.storeHook != nil {
		if err := hs.storeHook(k); err != nil {
			return offload.FailedOp(err)
		}
	}
	return hs.disk.Store(ctx, k, b)
}
