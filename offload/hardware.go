package offload

import "fmt"

// Hardware is the performance profile the planner predicts with. Rates are
// per second. `spill doctor` measures one; H200 gives the defaults.
type Hardware struct {
	Name string `json:"name"`
	// H2D and D2H are the copy bandwidths from pinned host memory, bytes/s;
	// Duplex is their combined rate when both run at once.
	H2D    float64 `json:"h2d_bytes_per_s"`
	D2H    float64 `json:"d2h_bytes_per_s"`
	Duplex float64 `json:"duplex_bytes_per_s"`
	// FLOPS16 and FLOPS32 are dense matmul rates in 16-bit and 32-bit
	// precision; Efficiency is the share of them a training step achieves
	// on large micro-batches (model FLOPs utilisation).
	FLOPS16    float64 `json:"flops_16"`
	FLOPS32    float64 `json:"flops_32"`
	Efficiency float64 `json:"efficiency"`
	// HalfEfficiencyTokens is the micro-batch size, in tokens, at which
	// the device reaches half of Efficiency (small batches underuse it).
	HalfEfficiencyTokens float64 `json:"half_efficiency_tokens"`
	// OpOverhead is the device time an op of the step program costs
	// beyond its FLOPs (its kernels' launches and tails, the executor's
	// binding and events), seconds: what makes many small micro-batches
	// slower than few large ones beyond the GEMMs' efficiency.
	OpOverhead float64 `json:"op_overhead_s,omitempty"`
	// DeviceBandwidth is device memory bandwidth, bytes/s (device optimizer).
	DeviceBandwidth float64 `json:"device_bytes_per_s"`
	// HostAdam is the host optimizer's rate in parameters per second.
	HostAdam float64 `json:"host_adam_params_per_s"`
	// DiskRead and DiskWrite are the disk tier's bandwidths, bytes/s.
	DiskRead  float64 `json:"disk_read_bytes_per_s"`
	DiskWrite float64 `json:"disk_write_bytes_per_s"`
	// DeviceReserve and HostReserve are bytes of each tier the planner
	// leaves to others (CUDA context and library workspaces; the process,
	// the data loader and the OS).
	DeviceReserve int64 `json:"device_reserve_bytes"`
	HostReserve   int64 `json:"host_reserve_bytes"`
	// Interconnect is the all-reduce bus bandwidth between the GPUs of a
	// data-parallel job, bytes/s, in nccl-tests' convention: an
	// all-reduce of n bytes over N ranks takes 2(N-1)/N x n / Interconnect
	// (a reduce-scatter plus an all-gather the same). 0 means
	// DefaultInterconnect; `spill doctor` leaves it there until it
	// measures one. It matters only to plans of several ranks.
	Interconnect float64 `json:"interconnect_bytes_per_s,omitempty"`
}

// DefaultInterconnect is the bus bandwidth assumed when a profile gives
// none: an H200 HGX box's NVLink 4 (900 GB/s per GPU both ways, 450 GB/s
// each way), of which NCCL's ring all-reduce reaches about 360 GB/s of
// bus bandwidth on large messages with NVLink multicast off (NVLS
// disabled, as the lent machines require). An assumption, not measured
// here: the several-GPU machines have not been lent yet. A PCIe-only box
// is far lower (about 20 GB/s for Gen5 through the host bridge, less
// across sockets): give it in the profile.
const DefaultInterconnect = 360e9

// InterconnectRate is Interconnect, or DefaultInterconnect when 0.
func (h Hardware) InterconnectRate() float64 {
	if h.Interconnect > 0 {
		return h.Interconnect
	}
	return DefaultInterconnect
}

// H200 is the profile of the lent H200 box, as `spill doctor` measured it
// there (2026-12-03, tools/bench/results/doctor_h200.json): pinned copies
// at 54.7 GB/s each way and 101 GB/s both at once (PCIe Gen5 x16); bf16
// GEMM at 787 TFLOP/s; the host AdamW at 3.85e9 parameters/s on 16
// threads over pinned memory, taken as 3.5e9 for the copies it shares the
// memory bus with. Efficiency and OpOverhead are fitted to the step times
// of four runs measured there the same day (engine/testdata/h200: in VRAM,
// streamed with activation offload, 6.7b with a split optimizer, 8
// sequences per step), which the model then predicts within 11%
// (TestTimeModelH200). Disk rates are assumptions.
func H200() Hardware {
	return Hardware{
		Name: "nvidia-h200 (defaults)",
		H2D:  54e9, D2H: 54e9, Duplex: 100e9,
		FLOPS16: 787e12, FLOPS32: 60e12, Efficiency: 0.72, HalfEfficiencyTokens: 256, OpOverhead: 1e-4,
		DeviceBandwidth: 4.8e12,
		HostAdam:        3.5e9,
		DiskRead:        1.4e9, DiskWrite: 1e9,
		DeviceReserve: 1 << 30, HostReserve: 4 << 30,
	}
}

// Validate reports a profile with a rate that is not positive.
func (h Hardware) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"h2d", h.H2D}, {"d2h", h.D2H}, {"duplex", h.Duplex}, {"flops_16", h.FLOPS16}, {"flops_32", h.FLOPS32},
		{"efficiency", h.Efficiency}, {"device bandwidth", h.DeviceBandwidth}, {"host adam", h.HostAdam},
		{"disk read", h.DiskRead}, {"disk write", h.DiskWrite}} {
		if !(f.v > 0) {
			return fmt.Errorf("offload: hardware profile %q: %s rate %v must be positive", h.Name, f.name, f.v)
		}
	}
	if h.Interconnect < 0 {
		return fmt.Errorf("offload: hardware profile %q: interconnect rate %v must not be negative (0: the default)", h.Name, h.Interconnect)
	}
	if h.HalfEfficiencyTokens < 0 || h.DeviceReserve < 0 || h.HostReserve < 0 {
		return fmt.Errorf("offload: hardware profile %q: negative reserve or half-efficiency size", h.Name)
	}
	return nil
}
