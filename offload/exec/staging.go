package exec

import (
	"context"
	"fmt"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// Staging is a Copier for host state that is not pinned: the copies pass
// through the few pinned buffers of a degraded host pool (its staging
// ring), chunk by chunk. A buffer is reused only once the copy that last
// used it has passed its event. Copies in are asynchronous (the source is
// read into the ring at once); copies out wait for each chunk, so the
// destination is written when CopyOut returns.
type Staging struct {
	be   kernels.Backend
	pool *offload.HostPool
	bufs []*offload.HostBuf
	evs  []kernels.Event
	next int
	// Chunks counts the chunks staged.
	Chunks int64
}

// NewStaging takes the staging buffers that cfg's pool decision names
// (HostDecision.StagingBuffers of StagingSize bytes).
func NewStaging(be kernels.Backend, cfg offload.HostConfig) (*Staging, error) {
	pool, err := offload.NewHostPool(cfg)
	if err != nil {
		return nil, err
	}
	d := pool.Decision()
	r := &Staging{be: be, pool: pool}
	for range d.StagingBuffers {
		b, ok, err := pool.TryAcquire(d.StagingSize)
		if err != nil || !ok {
			r.Close()
			return nil, fmt.Errorf("exec: staging buffer %d of %d: %v", len(r.bufs)+1, d.StagingBuffers, err)
		}
		r.bufs = append(r.bufs, b)
	}
	if len(r.bufs) == 0 {
		r.Close()
		return nil, fmt.Errorf("exec: the host pool decided no staging buffers")
	}
	r.evs = make([]kernels.Event, len(r.bufs))
	return r, nil
}

// take returns the next staging buffer once its last copy has passed.
func (r *Staging) take(ctx context.Context) (int, []byte, error) {
	i := r.next
	r.next = (i + 1) % len(r.bufs)
	r.Chunks++
	if ev := r.evs[i]; ev != nil {
		if err := ev.Synchronize(ctx); err != nil {
			return 0, nil, err
		}
		r.evs[i] = nil
	}
	return i, r.bufs[i].Bytes(), nil
}

// Bytes is the pinned memory the ring holds.
func (r *Staging) Bytes() int64 {
	var n int64
	for _, b := range r.bufs {
		n += int64(len(b.Bytes()))
	}
	return n
}

// Close releases the buffers; no queued copy may use them any more.
func (r *Staging) Close() {
	for _, b := range r.bufs {
		b.Release()
	}
	r.bufs = nil
	_ = r.pool.Close()
}

// CopyIn implements Copier.
func (r *Staging) CopyIn(ctx context.Context, q Queue, name string, dst kernels.Tensor, src []byte) error {
	es := int(dst.DType.Size())
	per := len(r.bufs[0].Bytes()) / es
	for off := 0; off < dst.N; off += per {
		n := min(per, dst.N-off)
		i, buf, err := r.take(ctx)
		if err != nil {
			return err
		}
		buf = buf[:n*es]
		copy(buf, src[off*es:(off+n)*es])
		part := kernels.View(dst.Buf, dst.Off+int64(off*es), dst.DType, n)
		if err := q.Enqueue(name, func(kq kernels.Queue) { r.be.CopyToDevice(kq, part, buf) }); err != nil {
			return err
		}
		if r.evs[i], err = q.Record(); err != nil {
			return err
		}
	}
	return nil
}

// CopyOut implements Copier.
func (r *Staging) CopyOut(ctx context.Context, q Queue, name string, dst []byte, src kernels.Tensor) error {
	es := int(src.DType.Size())
	per := len(r.bufs[0].Bytes()) / es
	for off := 0; off < src.N; off += per {
		n := min(per, src.N-off)
		_, buf, err := r.take(ctx)
		if err != nil {
			return err
		}
		buf = buf[:n*es]
		part := kernels.View(src.Buf, src.Off+int64(off*es), src.DType, n)
		if err := q.Enqueue(name, func(kq kernels.Queue) { r.be.CopyToHost(kq, buf, part) }); err != nil {
			return err
		}
		ev, err := q.Record()
		if err != nil {
			return err
		}
		if err := ev.Synchronize(ctx); err != nil {
			return err
		}
		copy(dst[off*es:(off+n)*es], buf)
	}
	return nil
}
