//go:build cuda

package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/compat -I/usr/local/cuda/include
#cgo LDFLAGS: -L/usr/local/cuda/lib64 -lcublas -lcuda
#include <stdint.h>
#include <cuda.h>
#include <cublas_v2.h>

static int spill_host_alloc(void **p, size_t n) {
	return (int)cuMemHostAlloc(p, n, CU_MEMHOSTALLOC_PORTABLE);
}

static int spill_host_free(void *p) { return (int)cuMemFreeHost(p); }

static int spill_blas_create(cublasHandle_t *h, uintptr_t stream) {
	cublasStatus_t s = cublasCreate(h);
	if (s != CUBLAS_STATUS_SUCCESS) return (int)s;
	s = cublasSetStream(*h, (cudaStream_t)stream);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasSetMathMode(*h, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
	if (s != CUBLAS_STATUS_SUCCESS) cublasDestroy(*h);
	return (int)s;
}

static int spill_blas_destroy(cublasHandle_t h) { return (int)cublasDestroy(h); }

// spill_gemm: column-major C(m,n) = alpha*op(A)*op(B) + beta*C, float32 accumulation.
static int spill_gemm(cublasHandle_t h, int ta, int tb, int m, int n, int k, float alpha,
		uint64_t A, int at, int lda, uint64_t B, int bt, int ldb, float beta,
		uint64_t C, int ct, int ldc) {
	return (int)cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
		m, n, k, &alpha, (const void *)(uintptr_t)A, (cudaDataType)at, lda,
		(const void *)(uintptr_t)B, (cudaDataType)bt, ldb, &beta,
		(void *)(uintptr_t)C, (cudaDataType)ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// spill_gemm_sb: spill_gemm over batch matrices at fixed strides (elements).
static int spill_gemm_sb(cublasHandle_t h, int ta, int tb, int m, int n, int k, float alpha,
		uint64_t A, int at, int lda, long long sa, uint64_t B, int bt, int ldb, long long sb, float beta,
		uint64_t C, int ct, int ldc, long long sc, int batch) {
	return (int)cublasGemmStridedBatchedEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
		m, n, k, &alpha, (const void *)(uintptr_t)A, (cudaDataType)at, lda, sa,
		(const void *)(uintptr_t)B, (cudaDataType)bt, ldb, sb, &beta,
		(void *)(uintptr_t)C, (cudaDataType)ct, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static int spill_cuda_version(void) { return CUDA_VERSION; }

static int spill_blas_version(cublasHandle_t h) {
	int v = 0;
	cublasGetVersion(h, &v);
	return v;
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
	"gorgonia.org/cu"
)

// cudaDataType values (library_types.h).
const (
	cudaR32F  = 0
	cudaR16F  = 2
	cudaR16BF = 14
)

func blasType(d kernels.DType) C.int {
	switch d {
	case kernels.F32:
		return cudaR32F
	case kernels.F16:
		return cudaR16F
	case kernels.BF16:
		return cudaR16BF
	}
	panic(fmt.Sprintf("kernels/cuda: no cuBLAS type for %v", d))
}

// blasError is a cuBLAS status code.
type blasError int

func (e blasError) Error() string { return fmt.Sprintf("cuBLAS status %d", int(e)) }

// driverError is a CUresult returned by this package's own cgo.
type driverError int

func (e driverError) Error() string { return fmt.Sprintf("CUDA driver error %d", int(e)) }

// blasHandle is a cuBLAS handle bound to one stream; used by its queue's
// goroutine only.
type blasHandle struct{ h C.cublasHandle_t }

func newBlasHandle(s cu.Stream) (*blasHandle, error) {
	var h C.cublasHandle_t
	if st := C.spill_blas_create(&h, C.uintptr_t(uintptr(unsafe.Pointer(s.C())))); st != 0 {
		return nil, fmt.Errorf("kernels/cuda: cublasCreate: %w", blasError(st))
	}
	return &blasHandle{h: h}, nil
}

func (b *blasHandle) destroy() { C.spill_blas_destroy(b.h) }

func (b *blasHandle) version() int { return int(C.spill_blas_version(b.h)) }

// gemm is cublasGemmEx in column-major terms with CUBLAS_COMPUTE_32F.
func (b *blasHandle) gemm(ta, tb bool, m, n, k int, alpha float32, A cu.DevicePtr, at kernels.DType, lda int,
	B cu.DevicePtr, bt kernels.DType, ldb int, beta float32, Cp cu.DevicePtr, ct kernels.DType, ldc int) error {
	st := C.spill_gemm(b.h, cbool(ta), cbool(tb), C.int(m), C.int(n), C.int(k), C.float(alpha),
		C.uint64_t(A), blasType(at), C.int(lda), C.uint64_t(B), blasType(bt), C.int(ldb), C.float(beta),
		C.uint64_t(Cp), blasType(ct), C.int(ldc))
	if st != 0 {
		return fmt.Errorf("kernels/cuda: cublasGemmEx %dx%dx%d (%v·%v→%v): %w", m, n, k, at, bt, ct, blasError(st))
	}
	return nil
}

// gemmStridedBatched is gemm over batch matrix triples, the i-th of each
// operand starting stride·i elements after the first.
func (b *blasHandle) gemmStridedBatched(ta, tb bool, m, n, k int, alpha float32, A cu.DevicePtr, at kernels.DType, lda int, sa int64,
	B cu.DevicePtr, bt kernels.DType, ldb int, sb int64, beta float32, Cp cu.DevicePtr, ct kernels.DType, ldc int, sc int64, batch int) error {
	st := C.spill_gemm_sb(b.h, cbool(ta), cbool(tb), C.int(m), C.int(n), C.int(k), C.float(alpha),
		C.uint64_t(A), blasType(at), C.int(lda), C.longlong(sa), C.uint64_t(B), blasType(bt), C.int(ldb), C.longlong(sb), C.float(beta),
		C.uint64_t(Cp), blasType(ct), C.int(ldc), C.longlong(sc), C.int(batch))
	if st != 0 {
		return fmt.Errorf("kernels/cuda: cublasGemmStridedBatchedEx %d×(%dx%dx%d) (%v·%v→%v): %w", batch, m, n, k, at, bt, ct, blasError(st))
	}
	return nil
}

func cbool(v bool) C.int {
	if v {
		return 1
	}
	return 0
}

// hostAlloc returns n bytes of page-locked host memory (current context).
func hostAlloc(n int) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	if r := C.spill_host_alloc(&p, C.size_t(n)); r != 0 {
		return nil, fmt.Errorf("kernels/cuda: cuMemHostAlloc(%d): %w", n, driverError(r))
	}
	return p, nil
}

func hostFree(p unsafe.Pointer) error {
	if r := C.spill_host_free(p); r != 0 {
		return fmt.Errorf("kernels/cuda: cuMemFreeHost: %w", driverError(r))
	}
	return nil
}

// buildCUDAVersion is CUDA_VERSION of the headers this package was built with.
func buildCUDAVersion() int { return int(C.spill_cuda_version()) }
