// Package cuda is the NVIDIA GPU implementation of kernels.Backend. It is
// compiled only with the build tag cuda; without it the package is empty and
// the rest of spill stays pure Go.
//
// Importing the package (in a cuda build) registers it as "cuda":
//
//	import _ "github.com/spill-ml/spill/kernels/cuda"
//	be, err := kernels.Open("cuda", kernels.Config{MemoryLimit: 40 << 30})
//
// # Building
//
// The driver API comes through gorgonia.org/cu; module loading, kernel
// launches (launchArgs: no allocation per launch), pinned host memory,
// cuBLAS (cublasGemmEx, float32 accumulation) and cuBLASLt (the GEMMs with
// a fused bias epilogue, matmul_lt.go) through a little cgo of this
// package. Build and test with tools/cuda/test.sh (tools/cuda/bench.sh
// also benchmarks GPT training against PyTorch; tools/cuda/pack.sh prepares
// the lent GPU machine's carry), or source
// tools/cuda/env.sh and use the go command with -tags cuda: env.sh puts
// compat/ first on the C include path (CGO_CFLAGS=-I...), whose cuda.h
// restores the pre-13 prototypes gorgonia.org/cu needs on CUDA 13 and is
// harmless on CUDA 12.
//
// The kernels are CUDA C++ in kernels/<op>.cu (extern "C" entry points named
// <op>_forward and <op>_backward), compiled to PTX for compute_80 (Ampere and
// later; kernels/*_sm90.cu for compute_90a, loaded on Hopper only, see
// flash_sm90.go) by `go generate` on a machine with nvcc (tools/cuda/ptx.sh). The
// PTX files in ptx/ are committed and embedded; the driver JIT-compiles
// them for the GPU when the backend opens.
//
// # Threads
//
// A CUDA context is current per OS thread, so every CUDA call runs on a
// goroutine locked to its OS thread (runtime.LockOSThread) on which the
// device's primary context was made current:
//
//   - each Queue is such a goroutine owning one CUDA stream (non-blocking)
//     and its own cuBLAS handle; the Backend methods that take a Queue
//     validate their arguments on the caller's goroutine (panicking on
//     misuse) and then hand the work to the queue's goroutine through a
//     channel, so they return at once and keep the caller's order. The
//     work travels as job values (a launch with its arguments, a memset, a
//     copy, a GEMM; a closure only for the rarer paths), so that an op
//     allocates nothing in steady state, and the goroutine launches
//     through this package's own cuLaunchKernel call (launchArgs);
//     HostStats reports how long the goroutines spend issuing work and
//     HostWait how long they wait instead (for the device, which they run
//     at most about 256 jobs ahead of, or for another queue's event);
//   - everything else (Alloc, Free, event waits, pinned memory) runs on a
//     small pool of such goroutines, grown when all are busy up to 128
//     (each is an OS thread); past that a caller waits for one. Events
//     the garbage collector drops are destroyed in batches by one job.
//
// Synchronize and Event.Synchronize wait on blocking-sync events from the
// pool, so a waiting caller does not spin a CPU core.
//
// # Memory
//
// Alloc draws on a hard budget (Config.MemoryLimit; 0 means the device's
// free memory at Open less a reserve for cuBLAS workspaces and the driver)
// and returns zeroed memory. Each queue also keeps a grow-only scratch area
// for reductions (partial sums of the bias and layernorm parameter
// gradients, the flash backward's row sums), the cuBLASLt workspace and
// GEMMs whose operand dtypes cuBLAS cannot mix; it is charged to the budget
// under the tag "scratch". For bf16 with head size 64, 80, 96 or 128, attention
// runs tensor-core flash kernels forward and backward, with no workspace
// (flash.go), once a self-check at Open has compared them with the
// row-wise kernels. Otherwise it runs through cuBLAS batched GEMMs with a
// second grow-only per-queue workspace for its score matrices, tag
// "attention" (at most 1/16 of the budget per round of score blocks; when
// it would take more than a quarter of the budget the CUDA-core kernels
// run instead, see attention.go). cuBLAS's own workspaces, the loaded
// modules and the self-checks' few hundred KiB (freed before Open
// returns) are outside the budget.
//
// cuBLAS and cuBLASLt keep split-K partial sums in float32; with
// SPILL_CUBLAS_REDUCED_PRECISION=1 at Open they may reduce them in the
// output type (bf16, f16), as PyTorch allows by default.
//
// The backend implements kernels.LlamaOps (llama.go): RMSNorm, RoPE and
// SwiGLU (kernels/llama.cu) and grouped-query attention, on the flash
// kernels for bf16 with head size 64, 80, 96 or 128 (the key/value gradients summed
// over each group inside one block, without atomics; the query gradients
// of the fused backwards, by default at head size 128 on Hopper and
// opt-in elsewhere with SPILL_FLASH_BWD=fused, with float32 atomics or
// bulk reductions, so not bitwise reproducible; SPILL_FLASH_BWD=sm90 keeps
// every head size on the split kernels, see flash.go) and on the
// row-wise kernels otherwise; with as many key/value heads as query heads
// it is AttentionForward and AttentionBackward.
//
// The backend implements kernels.Overwriter: the backward ops a layer
// chains (matmul, GELU, attention, cross-entropy) can write their input
// gradient instead of accumulating into a zeroed buffer.
//
// # Several GPUs
//
// The backend implements kernels.CommOpener on NCCL (nccl.go): NewCommID
// is ncclGetUniqueId, OpenComm ncclCommInitRank, and the kernels.Comm's
// collectives run on the stream of the queue they are enqueued on, issued
// from its goroutine (NCCL groups are per thread, so GroupStart and
// GroupEnd go there too). NCCL is opened at run time (dlopen of
// SPILL_NCCL_LIBRARY, else libnccl.so.2), so that neither the build nor a
// single-GPU run needs it; tools/cuda/env.sh points SPILL_NCCL_LIBRARY at
// the NCCL of PyTorch's wheel when there is one and puts its nccl.h on the
// include path, against which the build checks the binding's declarations.
// NCCL_NVLS_ENABLE is set to 0 before NCCL's first use unless the user set
// it: NVLink multicast stays off.
//
// Copies accept any host memory. Pageable memory makes a copy synchronous
// for the queue's goroutine (the driver stages it) but keeps the order;
// memory from AllocPinned (page-locked, cuMemHostAlloc) makes copies truly
// asynchronous, which is where the bandwidth comes from.
package cuda

//go:generate bash ../../tools/cuda/ptx.sh
