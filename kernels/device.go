package kernels

// DeviceInfo describes an accelerator for diagnostics (spill doctor).
type DeviceInfo struct {
	Name              string // "NVIDIA H200"
	Ordinal           int    // device index
	ComputeCapability string // "9.0"
	Multiprocessors   int
	TotalMemory       int64  // bytes
	FreeMemory        int64  // bytes free on the device when asked
	Driver            string // driver API version, "13.0"
	Runtime           string // toolkit the backend was built against, "13.0"
	BusID             string // PCI bus id, "0000:19:00.0"
}

// DeviceInspector is implemented by backends that can describe their
// device. Callers use it through a type assertion on a Backend.
type DeviceInspector interface {
	DeviceInfo() (DeviceInfo, error)
}

// PinnedAllocator is implemented by backends whose copies run faster (and
// truly asynchronously) from page-locked host memory. The engine and the
// offload scheduler use it, when a backend has it, for their staging
// buffers; any host memory works with the copies either way.
type PinnedAllocator interface {
	// AllocPinned returns n bytes of page-locked host memory, zeroed. It is
	// outside the device budget and outside the Go heap.
	AllocPinned(n int) ([]byte, error)
	// FreePinned releases memory from AllocPinned. The caller must ensure no
	// queued copy still uses it.
	FreePinned(b []byte) error
}
