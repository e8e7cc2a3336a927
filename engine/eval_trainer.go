package engine

import (
	"errors"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// errForwardOnly is returned by the training methods of a trainer built
// by newForwardTrainer.
var errForwardOnly = errors.New("engine: this trainer runs forward passes only (built for evaluation)")

// newForwardTrainer returns a Trainer that only evaluates (MicroLoss,
// Evaluate; TrainStep and Gradients return errForwardOnly): what a
// forward pass needs and nothing else. The host holds each layer's
// weights (fp32, plus the compute-dtype copy in mixed precision) and no
// gradients or optimizer state; the device holds the weights, fetched
// once, when they fit budget (the device cache's limit; 0: the
// backend's alone) beside the forward's working set, else none
// persistently: the forward program (schedule.Spec.Train false) then
// streams each layer's weights in just before its forward (a layer
// ahead) and frees them and the activations the next layer no longer
// needs after it, a device peak of about two layers' weights and
// activations and the io buffers whatever the model's size. Either way
// the losses are bitwise those of NewTrainer's Evaluate on the same
// weights: the same kernels run on the same values.
func newForwardTrainer(be kernels.Backend, m *Model, B, T int, budget int64) (*Trainer, error) {
	tr, err := newForwardTrainerAt(be, m, B, T, budget, offload.TierDevice)
	var oom *kernels.OOMError
	switch {
	case err == nil && (budget <= 0 || tr.PredictedDevicePeak() <= budget):
		return tr, nil
	case err == nil:
		tr.Close()
	case !errors.As(err, &oom) && !errors.Is(err, kernels.ErrOutOfMemory):
		return nil, err
	}
	return newForwardTrainerAt(be, m, B, T, budget, offload.TierHost)
}

// newForwardTrainerAt is newForwardTrainer with the weights' device
// residency chosen: TierDevice persistent, TierHost streamed.
func newForwardTrainerAt(be kernels.Backend, m *Model, B, T int, budget int64, weights offload.Tier) (*Trainer, error) {
	o := OffloadOptions{Weights: weights, Grads: offload.TierHost, Optimizer: offload.TierHost,
		Prefetch: 1, Group: 1, DeviceBudget: budget, forward: true}
	return newTrainer(be, m, TrainerOptions{B: B, T: T, Accum: 1, LossScale: 1, ScaleWindow: 1}, o)
}

// forwardHost sets up layer i of a forward-only trainer's host state:
// its master (fp32) and compute-dtype weights from take, in hostRequests'
// order, and their entries in the residency table; no gradients, no
// moments.
func (hs *hostState) forwardHost(i int, take func() []byte) error {
	h := &hs.host[i]
	np := int64(hs.m.Layers[i].NumParams())
	h.master = take()
	h.weights = h.master
	if hs.m.DType != kernels.F32 {
		h.weights = take()
	}
	if err := hs.table.Add(offload.Key{Layer: i, Class: offload.Weights}, np*int64(hs.m.DType.Size()), offload.TierHost); err != nil {
		return err
	}
	return hs.table.Add(offload.Key{Layer: i, Class: offload.Master}, 4*np, offload.TierHost)
}
