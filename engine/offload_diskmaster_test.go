package engine

import (
	"context"
	"testing"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

// TestDiskMasterBitwise: with the disk layers' master weights on disk too
// (DiskMaster), a run whose optimizer state is split across device, host
// and disk trains bit for bit as the same split with the master in RAM:
// in bf16, and in fp32 with the delayed update (in fp32 otherwise the
// master is the weights, and DiskMaster is refused). The host holds
// exactly what OffloadHostBytes plans (the disk tier's buffers
// included), the table records the masters on disk, and the disk tier
// moves each disk layer's master and moments once each way a step.
func TestDiskMasterBitwise(t *testing.T) {
	const steps = 3
	const dev, disk = 3, 6
	for _, tc := range []struct {
		name    string
		dt      kernels.DType
		delayed bool
	}{
		{"bf16", kernels.BF16, false},
		{"fp32-delayed", kernels.F32, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := oocOptions()
			to.GradClip = 0 // eager host updates, overlapped with the disk pipeline
			run := func(diskMaster bool) ([]float64, [][]float32, *Trainer) {
				m, err := NewGPT(oocShape, tc.dt)
				if err != nil {
					t.Fatal(err)
				}
				o := streamed()
				o.DelayedUpdate, o.DiskMaster = tc.delayed, diskMaster
				o.DiskDir, o.DiskBudget = t.TempDir(), 64<<20
				o.Optimizer = offload.TierDisk
				if !tc.delayed {
					o.OptimizerTiers = splitTiers(len(m.Layers), dev, disk)
				} else {
					o.OptimizerTiers = splitTiers(len(m.Layers), 0, disk)
				}
				o.Activations = recomputeBlocks(m)
				by, err := OffloadDeviceBytes(m, to.B, to.T, to.Accum, o)
				if err != nil {
					t.Fatal(err)
				}
				o.DeviceBudget = byteClasses(by).total()
				tr, check := newOOCModel(t, m, to, o)
				l, w := trainSteps(t, tr, steps)
				check()
				want, err := OffloadHostBytes(m, to.B, to.T, to.Accum, tr.off.opts)
				if err != nil {
					t.Fatal(err)
				}
				if got := tr.HostBytes(); got != byteClasses(want).total() {
					t.Errorf("DiskMaster %v: host bytes %d, planned %d", diskMaster, got, byteClasses(want).total())
				}
				return l, w, tr
			}
			wantL, wantW, ref := run(false)
			gotL, gotW, tr := run(true)
			sameRun(t, "master in RAM", wantL, gotL, wantW, gotW)
			n := len(tr.model.Layers)
			var moved, saved int64
			for i, l := range tr.model.Layers {
				if i >= n-disk {
					moved += steps * 24 * int64(l.NumParams())
					saved += 4 * int64(l.NumParams())
				}
			}
			if got := tr.off.host.diskBytes(); got != moved {
				t.Errorf("the disk tier moved %d bytes in %d steps, want %d", got, steps, moved)
			}
			// The host saves the disk layers' masters, less the disk
			// buffers' room for a master each.
			bufs := int64(len(tr.off.host.bufs)) * 4 * int64(tr.model.Layers[n-disk].NumParams())
			if d := ref.HostBytes() - tr.HostBytes(); d != saved-bufs {
				t.Errorf("DiskMaster saves %d host bytes, want %d", d, saved-bufs)
			}
			for _, r := range tr.Residency() {
				if r.Key.Class == offload.Master && r.Key.Layer >= n-disk && (r.Valid.String() != "disk" || r.InFlight) {
					t.Errorf("%s valid on %s (in flight %v), want disk", r.Key, r.Valid, r.InFlight)
				}
			}
			// The tensors saved come from the disk tier: a fresh trainer
			// loading them saves the same.
			ctx := context.Background()
			w0, o0, err := tr.SaveTensors(ctx)
			if err != nil {
				t.Fatal(err)
			}
			w1, o1, err := ref.SaveTensors(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for i := range w0 {
				if string(w0[i].Data) != string(w1[i].Data) {
					t.Fatalf("saved %s differs from the master in RAM's", w0[i].Name)
				}
			}
			for i := range o0 {
				if string(o0[i].Data) != string(o1[i].Data) {
					t.Fatalf("saved %s differs from the master in RAM's", o0[i].Name)
				}
			}
		})
	}

	m := mustGPT(t)
	o := streamed()
	o.Optimizer, o.DiskMaster, o.DiskDir, o.DiskBudget = offload.TierDisk, true, t.TempDir(), 64<<20
	if _, err := NewOffloadTrainer(openCPU(t), m, oocOptions(), o); err == nil {
		t.Error("DiskMaster in fp32 without a delayed update: no error")
	}
}
