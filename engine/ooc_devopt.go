package engine

import (
	"context"
	"runtime/debug"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
	"github.com/spill-ml/spill/offload/exec"
	"github.com/spill-ml/spill/offload/schedule"
	"github.com/spill-ml/spill/stream"
)

// The layers whose optimizer state is on the device (OffloadOptions.
// OptimizerTiers): their weights, gradients, master and moments are the
// executor's persistent blocks, the step's programs never move them, and
// updateDevice runs the backend's AdamW on them, as the resident trainer
// does, once the step's gradients are final and their norm known. The
// update goes on the compute queue after the step's last backward: it
// takes the same queue time wherever it is put after the layer's last
// backward, and there it sees the step's verdict on non-finite gradients
// and the clipping coefficient, so the arithmetic is the resident
// trainer's.

// devLayer is layer i's device state: the compute-dtype weights, the
// fp32 master (the weights themselves in fp32), the gradients and the
// moments.
type devLayer struct {
	weights, master, grads, m, v kernels.Tensor
}

// attachDevice gives the host state the backend, the compute queue and
// the executor whose persistent blocks hold the device layers' state, and
// zeroes that state (moments start at zero; the master is set by
// InitWeights or a checkpoint).
func (hs *hostState) attachDevice(be kernels.Backend, q kernels.Queue, ex *exec.Executor) error {
	hs.dev.be, hs.dev.q, hs.dev.ex = be, q, ex
	any := false
	for i, t := range hs.tier {
		if t != offload.TierDevice {
			continue
		}
		any = true
		d := hs.devLayer(i)
		for _, x := range []kernels.Tensor{d.weights, d.master, d.grads, d.m, d.v} {
			be.Zero(q, x)
		}
	}
	if !any {
		return nil
	}
	return q.Synchronize(context.Background())
}

// devLayer returns layer i's device tensors.
func (hs *hostState) devLayer(i int) devLayer {
	np := hs.m.Layers[i].NumParams()
	view := func(c schedule.Class, dt kernels.DType) kernels.Tensor {
		b := hs.dev.ex.Resident(c, i)
		if b == nil {
			return kernels.Tensor{}
		}
		return kernels.View(b.Buffer(), 0, dt, np)
	}
	d := devLayer{weights: view(schedule.Weights, hs.m.DType), master: view(schedule.Master, kernels.F32),
		grads: view(schedule.Grads, hs.m.DType), m: view(schedule.MomentM, kernels.F32), v: view(schedule.MomentV, kernels.F32)}
	if hs.m.DType == kernels.F32 {
		d.master = d.weights
	}
	return d
}

// updateDevice enqueues AdamW with hp on s, a stream of the compute
// queue, for every layer whose optimizer state is on the device (one op
// per layer, named by names).
func (hs *hostState) updateDevice(s *stream.Stream, names []string, hp kernels.AdamWParams) error {
	hs.dev.mu.Lock()
	defer hs.dev.mu.Unlock()
	for i, t := range hs.tier {
		if t != offload.TierDevice {
			continue
		}
		d := hs.devLayer(i)
		err := s.Enqueue(names[i], func(q kernels.Queue) {
			// One AdamW per run of adjacent tensors that share their
			// weight decay (a layer's tensors are contiguous; the update
			// is elementwise, so the bits are those of one call per
			// tensor): fewer, longer launches.
			ps := hs.m.Layers[i].Params()
			for a := 0; a < len(ps); {
				z := a + 1
				for z < len(ps) && ps[z].Decay == ps[a].Decay && ps[z].Offset == ps[z-1].Offset+ps[z-1].Elems() {
					z++
				}
				off, n := ps[a].Offset, ps[z-1].Offset+ps[z-1].Elems()-ps[a].Offset
				p := hp
				if !ps[a].Decay {
					p.WeightDecay = 0
				}
				a = z
				out := kernels.Tensor{}
				if d.weights.Buf != d.master.Buf {
					out = d.weights.Slice(off, n)
				}
				hs.dev.be.AdamW(q, d.master.Slice(off, n), d.grads.Slice(off, n), d.m.Slice(off, n), d.v.Slice(off, n), out, p)
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// setDeviceMaster is setMaster for a layer updated on the device: fill
// writes the master on the host, which is copied up and cast to the
// compute copy.
func (hs *hostState) setDeviceMaster(i int, fill func(master []float32)) error {
	n := 4 * int64(hs.m.Layers[i].NumParams())
	b, stage := hs.stageBuf()
	b = b[:n]
	defer func() { stage <- b }() // never blocks: the channel holds every buffer
	fill(offload.F32s(b))
	hs.dev.mu.Lock()
	defer hs.dev.mu.Unlock()
	d := hs.devLayer(i)
	be, q := hs.dev.be, hs.dev.q
	be.CopyToDevice(q, d.master, b)
	if d.weights.Buf != d.master.Buf {
		be.Cast(q, d.weights, d.master)
	}
	return q.Synchronize(context.Background()) // b must outlive the copy
}

// stageBuf returns a buffer of the largest device layer's fp32 master
// (an idle one, a new one while there are fewer than devStageBytes allow,
// else the next one given back) and the channel to give it back to.
func (hs *hostState) stageBuf() ([]byte, chan []byte) {
	var largest int64
	for j, t := range hs.tier {
		if t == offload.TierDevice {
			largest = max(largest, 4*int64(hs.m.Layers[j].NumParams()))
		}
	}
	hs.dev.mu.Lock()
	if hs.dev.stage == nil {
		hs.dev.stageN = int(max(1, devStageBytes/largest))
		hs.dev.stage = make(chan []byte, hs.dev.stageN)
	}
	stage := hs.dev.stage
	select {
	case b := <-stage:
		hs.dev.mu.Unlock()
		return b, stage
	default:
	}
	if hs.dev.staged < hs.dev.stageN {
		hs.dev.staged++
		hs.dev.mu.Unlock()
		return offload.NewF32Bytes(largest), stage
	}
	hs.dev.mu.Unlock()
	return <-stage, stage
}

// dropStage frees stageBuf's buffers (none may be in use) and gives the
// heap back to the system: the process would otherwise keep it as
// resident memory that the plan does not count.
func (hs *hostState) dropStage() {
	hs.dev.mu.Lock()
	had := hs.dev.stage != nil
	hs.dev.stage, hs.dev.stageN, hs.dev.staged = nil, 0, 0
	hs.dev.mu.Unlock()
	if had {
		debug.FreeOSMemory()
	}
}

// deviceOptim copies layer i's master and moments from the device.
func (hs *hostState) deviceOptim(ctx context.Context, i int) (master, m, v []byte, err error) {
	hs.dev.mu.Lock()
	defer hs.dev.mu.Unlock()
	d := hs.devLayer(i)
	n := 4 * int64(hs.m.Layers[i].NumParams())
	master, m, v = offload.NewF32Bytes(n), offload.NewF32Bytes(n), offload.NewF32Bytes(n)
	for j, x := range []kernels.Tensor{d.master, d.m, d.v} {
		hs.dev.be.CopyToHost(hs.dev.q, [][]byte{master, m, v}[j], x)
	}
	return master, m, v, hs.dev.q.Synchronize(ctx)
}

// setDeviceOptim copies layer i's moments to the device.
func (hs *hostState) setDeviceOptim(ctx context.Context, i int, m, v []byte) error {
	hs.dev.mu.Lock()
	defer hs.dev.mu.Unlock()
	d := hs.devLayer(i)
	hs.dev.be.CopyToDevice(hs.dev.q, d.m, m)
	hs.dev.be.CopyToDevice(hs.dev.q, d.v, v)
	return hs.dev.q.Synchronize(ctx) // m and v must outlive the copies
}
