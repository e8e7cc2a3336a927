package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/spill-ml/spill/engine"
	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/offload"
)

func init() {
	register(&command{name: "doctor", summary: "check the GPU: device, memory, versions, copy bandwidth, GEMM speed", run: runDoctor})
}

const doctorUsage = `Usage: spill doctor [flags]

Opens the CUDA backend and reports the device, its memory, the driver and
CUDA versions, the measured host<->device copy bandwidth from pinned memory
(each way and both at once), the bf16 GEMM rate, the host AdamW rate and
the disk tier's read and write rates (--disk-dir; the planner uses them
for optimizer state on disk). It exits 1 when spill
was built without CUDA (build with -tags cuda, see tools/cuda/env.sh) or no
GPU can be opened.

Example:
  spill doctor --device 0 --mib 512`

func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("doctor", doctorUsage, stderr)
	device := fs.Int("device", 0, "CUDA device ordinal")
	mib := fs.Int("mib", 256, "size of each bandwidth test copy in MiB")
	gemm := fs.Int("gemm", 8192, "size n of the n×n×n bf16 GEMM")
	hostM := fs.Int("host-params", 64, "millions of parameters in the host optimizer test (0: skip it)")
	jsonOut := fs.String("json", "", "also write the measured rates as a hardware profile for spill plan --hardware")
	diskDir := fs.String("disk-dir", "", "directory of the disk tier to measure (default: spill/offload in the user cache directory)")
	diskMiB := fs.Int("disk-mib", 1024, "MiB written and read back by the disk tier test (0: skip it)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("doctor takes no arguments (got %q)", fs.Args())
	}
	if *mib <= 0 || *gemm <= 0 || *hostM < 0 || *diskMiB < 0 {
		return usagef("--mib and --gemm must be positive, --host-params and --disk-mib not negative")
	}
	if !slices.Contains(kernels.Backends(), "cuda") {
		return errors.New("doctor: this spill was built without CUDA support; rebuild with -tags cuda on a machine with the CUDA toolkit (see tools/cuda/env.sh)")
	}
	be, err := kernels.Open("cuda", kernels.Config{Device: *device})
	if err != nil {
		return fmt.Errorf("doctor: no usable GPU: %w", err)
	}
	defer be.Close()

	fmt.Fprintf(stdout, "device        %s\n", be.DeviceName())
	if di, ok := be.(kernels.DeviceInspector); ok {
		info, err := di.DeviceInfo()
		if err != nil {
			return fmt.Errorf("doctor: device info: %w", err)
		}
		fmt.Fprintf(stdout, "compute       %s, %d multiprocessors, PCI %s\n", info.ComputeCapability, info.Multiprocessors, info.BusID)
		fmt.Fprintf(stdout, "memory        %s total, %s free\n", kernels.FormatBytes(info.TotalMemory), kernels.FormatBytes(info.FreeMemory))
		fmt.Fprintf(stdout, "driver        CUDA %s (built with CUDA %s)\n", info.Driver, info.Runtime)
	}
	fmt.Fprintf(stdout, "budget        %s\n", kernels.FormatBytes(be.MemStats().Limit))

	h2d, d2h, bidir, err := measureCopies(ctx, be, int64(*mib)<<20)
	if err != nil {
		return fmt.Errorf("doctor: bandwidth: %w", err)
	}
	fmt.Fprintf(stdout, "pinned H2D    %.1f GB/s\n", h2d)
	fmt.Fprintf(stdout, "pinned D2H    %.1f GB/s\n", d2h)
	fmt.Fprintf(stdout, "bidirectional %.1f GB/s\n", bidir)

	tflops, err := measureGEMM(ctx, be, *gemm)
	if err != nil {
		return fmt.Errorf("doctor: gemm: %w", err)
	}
	fmt.Fprintf(stdout, "bf16 GEMM     %.0f TFLOP/s (%d×%d×%d, fp32 accumulation)\n", tflops, *gemm, *gemm, *gemm)

	hw := offload.H200()
	hw.Name = "measured by spill doctor on " + be.DeviceName()
	hw.H2D, hw.D2H, hw.Duplex, hw.FLOPS16 = h2d*1e9, d2h*1e9, bidir*1e9, tflops*1e12
	if *hostM > 0 {
		hr, err := measureHost(be, *hostM<<20)
		if err != nil {
			return fmt.Errorf("doctor: host optimizer: %w", err)
		}
		fmt.Fprintf(stdout, "host AdamW    %.2f G params/s pinned, %.2f G params/s Go memory (%d threads, %dM params)\n",
			hr.AdamPinned/1e9, hr.AdamGo/1e9, runtime.GOMAXPROCS(0), *hostM)
		fmt.Fprintf(stdout, "host finite   %.1f G params/s; memcpy %.1f GB/s\n", hr.Finite/1e9, hr.Copy/1e9)
		if hr.Pin1 > 0 {
			fmt.Fprintf(stdout, "host pinning  %.1f GB/s one buffer at a time, %.1f GB/s four at once\n", hr.Pin1/1e9, hr.Pin4/1e9)
		}
		hw.HostAdam = hr.AdamGo
		if hr.AdamPinned > 0 {
			hw.HostAdam = hr.AdamPinned
		}
	}
	if *diskMiB > 0 {
		dir := *diskDir
		if dir == "" {
			dir = engine.DefaultDiskDir(&engine.Config{})
		}
		dr, err := offload.MeasureDisk(ctx, dir, int64(*diskMiB)<<20)
		if err != nil {
			return fmt.Errorf("doctor: disk tier: %w", err)
		}
		how := "direct I/O"
		if !dr.Direct {
			how = "through the page cache: the rates overstate the drive"
		}
		fmt.Fprintf(stdout, "disk tier     %.2f GB/s read, %.2f GB/s write (fsync'd), %s, %d MiB in %s\n",
			dr.Read/1e9, dr.Write/1e9, how, *diskMiB, dir)
		hw.DiskRead, hw.DiskWrite = dr.Read, dr.Write
	}
	if *jsonOut != "" {
		return engine.WriteFileAtomic(*jsonOut, func(w io.Writer) error {
			e := json.NewEncoder(w)
			e.SetIndent("", "  ")
			return e.Encode(hw)
		})
	}
	return nil
}

// measureCopies times copies of n bytes between pinned host memory (when the
// backend offers it) and the device: host to device, device to host, and
// both at once on two queues. It returns GB/s (10^9 bytes per second).
func measureCopies(ctx context.Context, be kernels.Backend, n int64) (h2d, d2h, bidir float64, err error) {
	host := func() ([]byte, func(), error) {
		if pa, ok := be.(kernels.PinnedAllocator); ok {
			b, err := pa.AllocPinned(int(n))
			if err != nil {
				return nil, nil, err
			}
			return b, func() { _ = pa.FreePinned(b) }, nil
		}
		return make([]byte, n), func() {}, nil
	}
	up, freeUp, err := host()
	if err != nil {
		return 0, 0, 0, err
	}
	defer freeUp()
	down, freeDown, err := host()
	if err != nil {
		return 0, 0, 0, err
	}
	defer freeDown()
	var bufs [2]kernels.Buffer
	for i := range bufs {
		if bufs[i], err = be.Alloc(n, "doctor"); err != nil {
			return 0, 0, 0, err
		}
		defer be.Free(bufs[i])
	}
	qa, err := be.NewQueue("h2d")
	if err != nil {
		return 0, 0, 0, err
	}
	qb, err := be.NewQueue("d2h")
	if err != nil {
		return 0, 0, 0, err
	}
	a, b := kernels.View(bufs[0], 0, kernels.U8, int(n)), kernels.View(bufs[1], 0, kernels.U8, int(n))
	const reps = 8
	run := func(h2d, d2h bool) (float64, error) {
		for warm := range 2 {
			start := time.Now()
			k := 1
			if warm == 1 {
				k = reps
			}
			for range k {
				if h2d {
					be.CopyToDevice(qa, a, up)
				}
				if d2h {
					be.CopyToHost(qb, down, b)
				}
			}
			if err := qa.Synchronize(ctx); err != nil {
				return 0, err
			}
			if err := qb.Synchronize(ctx); err != nil {
				return 0, err
			}
			if warm == 1 {
				moved := float64(n) * reps
				if h2d && d2h {
					moved *= 2
				}
				return moved / time.Since(start).Seconds() / 1e9, nil
			}
		}
		return 0, nil
	}
	if h2d, err = run(true, false); err != nil {
		return
	}
	if d2h, err = run(false, true); err != nil {
		return
	}
	bidir, err = run(true, true)
	return
}

// measureGEMM times bf16 MatmulForward of n×n by n×n and returns TFLOP/s.
func measureGEMM(ctx context.Context, be kernels.Backend, n int) (float64, error) {
	elems := n * n
	var ts [3]kernels.Tensor
	for i := range ts {
		buf, err := be.Alloc(int64(elems)*2, "doctor")
		if err != nil {
			return 0, err
		}
		defer be.Free(buf)
		ts[i] = kernels.View(buf, 0, kernels.BF16, elems)
	}
	q := be.DefaultQueue()
	be.Fill(q, ts[1], 0.01)
	be.Fill(q, ts[2], 0.02)
	be.MatmulForward(q, ts[0], ts[1], ts[2], kernels.Tensor{}, n, n, n) // warm-up
	if err := q.Synchronize(ctx); err != nil {
		return 0, err
	}
	reps := max(3, min(50, int(2e14/(2*float64(n)*float64(n)*float64(n)))))
	start := time.Now()
	for range reps {
		be.MatmulForward(q, ts[0], ts[1], ts[2], kernels.Tensor{}, n, n, n)
	}
	if err := q.Synchronize(ctx); err != nil {
		return 0, err
	}
	return 2 * float64(n) * float64(n) * float64(n) * float64(reps) / time.Since(start).Seconds() / 1e12, nil
}
