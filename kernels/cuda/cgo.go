//go:build cuda

package cuda

/*
#cgo CFLAGS: -I${SRCDIR}/compat -I/usr/local/cuda/include
#cgo LDFLAGS: -L/usr/local/cuda/lib64 -lcublasLt -lcublas -lcuda
#cgo noescape spill_launch
#cgo nocallback spill_launch
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cuda.h>
#include <cublas_v2.h>
#include <cublasLt.h>

// compat/cuda.h routes cuInit to a wrapper that never fails (for
// gorgonia.org/cu's package init); this is the real one.
#undef cuInit
static int spill_cu_init(void) { return (int)cuInit(0); }

static const char *spill_cu_error(int r) {
	const char *s = 0;
	if (cuGetErrorString((CUresult)r, &s) != CUDA_SUCCESS || s == 0) return "unknown error";
	return s;
}

// spill_launch launches f with n kernel arguments, each in an 8-byte slot
// of args (the driver reads the parameter's own size from the start of its
// slot). cuLaunchKernel copies the arguments before it returns, so the
// caller may reuse args at once; the pointer array lives on this stack.
// With last non-null the last argument is read from last instead (a
// kernel's tensor maps, 128 bytes each, passed by value).
#define SPILL_MAX_ARGS 24
static int spill_launch(uintptr_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		unsigned smem, uintptr_t stream, uint64_t *args, int n, void *last) {
	void *p[SPILL_MAX_ARGS];
	if (n < 0 || n > SPILL_MAX_ARGS || (last && n == 0)) return (int)CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < n; i++) p[i] = &args[i];
	if (last) p[n - 1] = last;
	return (int)cuLaunchKernel((CUfunction)f, gx, gy, gz, bx, by, bz, smem, (CUstream)stream, p, NULL);
}

// Modules: PTX loaded into the current context, entry points by name.
static int spill_module_load(uintptr_t *m, const char *image) {
	CUmodule mod = 0;
	int r = (int)cuModuleLoadData(&mod, image);
	*m = (uintptr_t)mod;
	return r;
}

static int spill_module_function(uintptr_t *f, uintptr_t m, const char *name) {
	CUfunction fn = 0;
	int r = (int)cuModuleGetFunction(&fn, (CUmodule)m, name);
	*f = (uintptr_t)fn;
	return r;
}

static int spill_module_unload(uintptr_t m) { return (int)cuModuleUnload((CUmodule)m); }

// spill_func_max_dynamic_smem lets f take up to n bytes of dynamic shared
// memory per block (past the default 48 KB where the device allows it).
static int spill_func_max_dynamic_smem(uintptr_t f, int n) {
	return (int)cuFuncSetAttribute((CUfunction)f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, n);
}

// spill_func_occupancy sets *n to the blocks of f, of threads threads and
// smem bytes of dynamic shared memory, that one multiprocessor keeps
// resident.
static int spill_func_occupancy(uintptr_t f, int threads, int smem, int *n) {
	return (int)cuOccupancyMaxActiveBlocksPerMultiprocessor(n, (CUfunction)f, threads, (size_t)smem);
}

static int spill_host_alloc(void **p, size_t n) {
	return (int)cuMemHostAlloc(p, n, CU_MEMHOSTALLOC_PORTABLE);
}

static int spill_host_free(void *p) { return (int)cuMemFreeHost(p); }

static int spill_host_register(void *p, size_t n) {
	return (int)cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE);
}

static int spill_host_unregister(void *p) { return (int)cuMemHostUnregister(p); }

// spill_blas_create makes a cuBLAS handle on stream; reduced allows split-K
// reductions in the output type (bf16/f16) as PyTorch does by default,
// else they stay in float32.
static int spill_blas_create(cublasHandle_t *h, uintptr_t stream, int reduced) {
	cublasStatus_t s = cublasCreate(h);
	if (s != CUBLAS_STATUS_SUCCESS) return (int)s;
	s = cublasSetStream(*h, (cudaStream_t)stream);
	int mode = CUBLAS_DEFAULT_MATH;
	if (!reduced) mode |= CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasSetMathMode(*h, (cublasMath_t)mode);
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

static int spill_lt_create(cublasLtHandle_t *h) { return (int)cublasLtCreate(h); }

static int spill_lt_destroy(cublasLtHandle_t h) { return (int)cublasLtDestroy(h); }

// spill_lt_plan: a cuBLASLt matmul descriptor, its layouts and algorithm.
typedef struct {
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t a, b, d;
	cublasLtMatmulAlgo_t algo;
	size_t ws;
	int epi;
} spill_lt_plan;

static void spill_lt_plan_free(spill_lt_plan *p) {
	if (p == NULL) return;
	if (p->d) cublasLtMatrixLayoutDestroy(p->d);
	if (p->b) cublasLtMatrixLayoutDestroy(p->b);
	if (p->a) cublasLtMatrixLayoutDestroy(p->a);
	if (p->desc) cublasLtMatmulDescDestroy(p->desc);
	free(p);
}

// Epilogues of spill_lt_plan_make (epi): column-major, ab = op(A)*op(B) with
// float32 accumulation and scale,
//   SPILL_EPI_BIAS:      D = ab + bias(m)                (CUBLASLT_EPILOGUE_BIAS)
//   SPILL_EPI_GELU_BIAS: aux = ab + bias(m), D = gelu(aux) (CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
//   SPILL_EPI_DGELU:     D = gelu'(aux) * ab             (CUBLASLT_EPILOGUE_DGELU)
//   SPILL_EPI_RESID:     D = ab + aux                    (beta 1, C = aux)
//   SPILL_EPI_BIAS_RESID: D = ab + bias(m) + aux        (CUBLASLT_EPILOGUE_BIAS, beta 1, C = aux)
// gelu is the tanh approximation; aux is an (m,n) matrix of D's type with
// leading dimension auxld (for the residual ones, D's layout: auxld = ldd).
#define SPILL_EPI_BIAS 0
#define SPILL_EPI_GELU_BIAS 1
#define SPILL_EPI_DGELU 2
#define SPILL_EPI_RESID 3
#define SPILL_EPI_BIAS_RESID 4
#define SPILL_EPI_HAS_AUX(e) ((e) == SPILL_EPI_GELU_BIAS || (e) == SPILL_EPI_DGELU)
#define SPILL_EPI_HAS_BIAS(e) ((e) == SPILL_EPI_BIAS || (e) == SPILL_EPI_GELU_BIAS || (e) == SPILL_EPI_BIAS_RESID)
#define SPILL_EPI_HAS_C(e) ((e) == SPILL_EPI_RESID || (e) == SPILL_EPI_BIAS_RESID)

// spill_lt_plan_make plans one of the epilogues above (split-K reductions in
// the output type only with reduced). The bias has D's type (the default of
// CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, the only one documented outside int8
// and fp8). bias and aux are addresses with the alignment of those to come;
// al* are the alignments of A, B and D in bytes.
static int spill_lt_plan_make(cublasLtHandle_t h, spill_lt_plan **out, int epi, int ta, int tb, int m, int n, int k,
		int abt, int lda, int ldb, int dt, int ldd, uint64_t bias, uint64_t aux, int64_t auxld,
		uint32_t alA, uint32_t alB, uint32_t alC, uint32_t alD, uint64_t maxWs, int reduced) {
	*out = NULL;
	spill_lt_plan *p = (spill_lt_plan *)calloc(1, sizeof *p);
	if (p == NULL) return (int)CUBLAS_STATUS_ALLOC_FAILED;
	cublasLtMatmulPreference_t pref = NULL;
	int32_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	uint32_t e = epi == SPILL_EPI_GELU_BIAS ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
	           : epi == SPILL_EPI_DGELU     ? CUBLASLT_EPILOGUE_DGELU
	           : epi == SPILL_EPI_RESID     ? CUBLASLT_EPILOGUE_DEFAULT
	                                        : CUBLASLT_EPILOGUE_BIAS;
	const void *bp = (const void *)(uintptr_t)bias, *xp = (const void *)(uintptr_t)aux;
	uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
	if (reduced) red = CUBLASLT_REDUCTION_SCHEME_MASK;
	cublasLtMatmulHeuristicResult_t r;
	int found = 0;
	cublasStatus_t s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
#define SPILL_TRY(x) if (s == CUBLAS_STATUS_SUCCESS) s = (x)
	SPILL_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
	SPILL_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
	SPILL_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
	if (SPILL_EPI_HAS_BIAS(epi))
		SPILL_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
	if (SPILL_EPI_HAS_AUX(epi)) {
		SPILL_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &xp, sizeof xp));
		SPILL_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxld, sizeof auxld));
	}
	SPILL_TRY(cublasLtMatrixLayoutCreate(&p->a, (cudaDataType)abt, ta ? k : m, ta ? m : k, lda));
	SPILL_TRY(cublasLtMatrixLayoutCreate(&p->b, (cudaDataType)abt, tb ? n : k, tb ? k : n, ldb));
	SPILL_TRY(cublasLtMatrixLayoutCreate(&p->d, (cudaDataType)dt, m, n, ldd));
	SPILL_TRY(cublasLtMatmulPreferenceCreate(&pref));
	SPILL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &maxWs, sizeof maxWs));
	SPILL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red));
	SPILL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alA, sizeof alA));
	SPILL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alB, sizeof alB));
	SPILL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alC, sizeof alC));
	SPILL_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alD, sizeof alD));
	SPILL_TRY(cublasLtMatmulAlgoGetHeuristic(h, p->desc, p->a, p->b, p->d, p->d, pref, 1, &r, &found));
#undef SPILL_TRY
	if (s == CUBLAS_STATUS_SUCCESS && (found < 1 || r.state != CUBLAS_STATUS_SUCCESS)) s = CUBLAS_STATUS_NOT_SUPPORTED;
	if (pref) cublasLtMatmulPreferenceDestroy(pref);
	if (s != CUBLAS_STATUS_SUCCESS) {
		spill_lt_plan_free(p);
		return (int)s;
	}
	p->algo = r.algo;
	p->ws = r.workspaceSize;
	p->epi = epi;
	*out = p;
	return 0;
}

// spill_lt_matmul runs a plan of spill_lt_plan_make with these operands (bias
// and aux as its epilogue takes them).
static int spill_lt_matmul(cublasLtHandle_t h, spill_lt_plan *p, uint64_t A, uint64_t B, uint64_t D,
		uint64_t bias, uint64_t aux, uint64_t ws, uintptr_t stream) {
	const void *bp = (const void *)(uintptr_t)bias, *xp = (const void *)(uintptr_t)aux;
	cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
	if (SPILL_EPI_HAS_BIAS(p->epi))
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp);
	if (s == CUBLAS_STATUS_SUCCESS && SPILL_EPI_HAS_AUX(p->epi))
		s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &xp, sizeof xp);
	if (s != CUBLAS_STATUS_SUCCESS) return (int)s;
	float alpha = 1.f, beta = SPILL_EPI_HAS_C(p->epi) ? 1.f : 0.f;
	void *d = (void *)(uintptr_t)D;
	const void *c = SPILL_EPI_HAS_C(p->epi) ? xp : d;
	return (int)cublasLtMatmul(h, p->desc, &alpha, (const void *)(uintptr_t)A, p->a, (const void *)(uintptr_t)B, p->b,
		&beta, c, p->d, d, p->d, &p->algo, (void *)(uintptr_t)ws, p->ws, (cudaStream_t)stream);
}

static size_t spill_lt_plan_ws(spill_lt_plan *p) { return p->ws; }

static int spill_cuda_version(void) { return CUDA_VERSION; }

// spill_tmap3 encodes into out (128 bytes) the tensor map of a bf16 array
// at ptr (16-byte aligned; the flash kernels' packed qkv or dout): a 3-D
// tensor of w columns (contiguous, w a multiple of 8), t rows (w·2 bytes
// apart) and b batches (t·w·2 bytes apart), copied in boxes of 64 columns
// by rows rows in the 128-byte swizzle, elements outside it read as zeros
// (flashattn_sm90.cu's flash_fwd5 and warp-specialised backward kernels).
// The driver entry point is CUDA 12's: built against older headers it
// reports CUDA_ERROR_NOT_SUPPORTED.
static int spill_tmap3(void *out, uint64_t ptr, uint64_t w, uint64_t t, uint64_t b, unsigned rows) {
#if CUDA_VERSION >= 12000
	CUtensorMap m;
	cuuint64_t dims[3] = {w, t, b};
	cuuint64_t strides[2] = {w * 2, t * w * 2};
	cuuint32_t box[3] = {64, rows, 1};
	cuuint32_t es[3] = {1, 1, 1};
	CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)(uintptr_t)ptr, dims, strides,
		box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
		CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
	if (r == CUDA_SUCCESS) memcpy(out, &m, sizeof m);
	return (int)r;
#else
	(void)out; (void)ptr; (void)w; (void)t; (void)b; (void)rows;
	return (int)CUDA_ERROR_NOT_SUPPORTED;
#endif
}

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

func (e driverError) Error() string {
	return fmt.Sprintf("CUDA driver error %d (%s)", int(e), C.GoString(C.spill_cu_error(C.int(e))))
}

// maxArgs is the most kernel arguments a launch takes (SPILL_MAX_ARGS).
const maxArgs = C.SPILL_MAX_ARGS

// kfunc is a kernel entry point (a CUfunction) of a module loaded by
// loadModule; valid while the backend is open.
type kfunc uintptr

// launchArgs launches fn on stream s (a CUstream) with the first n slots
// of args; with maps non-nil the last argument is maps' first 128 bytes
// per tensor map instead (job.withTensorMaps). It allocates nothing: the
// pointer array the driver wants is built on the C stack and the driver
// copies the values before returning.
func launchArgs(s uintptr, fn kfunc, grid, block dim3, smem uint32, args *[maxArgs]uint64, n int, maps *tensorMaps) error {
	var last unsafe.Pointer
	if maps != nil {
		last = unsafe.Pointer(&maps[0])
	}
	r := C.spill_launch(C.uintptr_t(fn), C.uint(grid.x), C.uint(max(grid.y, 1)), C.uint(max(grid.z, 1)),
		C.uint(block.x), C.uint(max(block.y, 1)), C.uint(max(block.z, 1)), C.uint(smem), C.uintptr_t(s),
		(*C.uint64_t)(unsafe.Pointer(&args[0])), C.int(n), last)
	if r != 0 {
		return driverError(r)
	}
	return nil
}

// setMaxDynamicShared lets fn's launches ask for up to n bytes of dynamic
// shared memory (job.smem; a kernel that needs more than 48 KB per block
// must be allowed it once, before its first launch).
func setMaxDynamicShared(fn kfunc, n int) error {
	if r := C.spill_func_max_dynamic_smem(C.uintptr_t(fn), C.int(n)); r != 0 {
		return driverError(r)
	}
	return nil
}

// blocksPerSM is how many blocks of fn, of threads threads and smem bytes
// of dynamic shared memory, one multiprocessor keeps resident.
func blocksPerSM(fn kfunc, threads, smem int) (int, error) {
	var n C.int
	if r := C.spill_func_occupancy(C.uintptr_t(fn), C.int(threads), C.int(smem), &n); r != 0 {
		return 0, driverError(r)
	}
	return int(n), nil
}

// streamHandle is the CUstream of s as an integer for this package's cgo.
func streamHandle(s cu.Stream) uintptr { return uintptr(unsafe.Pointer(s.C())) }

// moduleLoad loads a PTX image into the current context.
func moduleLoad(image string) (uintptr, error) {
	cs := C.CString(image)
	defer C.free(unsafe.Pointer(cs))
	var m C.uintptr_t
	if r := C.spill_module_load(&m, cs); r != 0 {
		return 0, driverError(r)
	}
	return uintptr(m), nil
}

// moduleFunction returns entry point name of module m.
func moduleFunction(m uintptr, name string) (kfunc, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var f C.uintptr_t
	if r := C.spill_module_function(&f, C.uintptr_t(m), cs); r != 0 {
		return 0, driverError(r)
	}
	return kfunc(f), nil
}

func moduleUnload(m uintptr) error {
	if r := C.spill_module_unload(C.uintptr_t(m)); r != 0 {
		return driverError(r)
	}
	return nil
}

// cuBLAS status codes (cublas_api.h).
const (
	blasInvalidValue = 7
	blasNotSupported = 15
)

// blasHandle is a cuBLAS handle bound to one stream; used by its queue's
// goroutine only.
type blasHandle struct {
	h     C.cublasHandle_t
	lt    *ltHandle // cuBLASLt, made on first use (matmul_lt.go)
	ltErr error     // why lt could not be made
}

// newBlasHandle makes a cuBLAS handle on s; reduced lets its split-K
// reductions run in the output type (reducedPrecision).
func newBlasHandle(s cu.Stream, reduced bool) (*blasHandle, error) {
	var h C.cublasHandle_t
	if st := C.spill_blas_create(&h, C.uintptr_t(uintptr(unsafe.Pointer(s.C()))), cbool(reduced)); st != 0 {
		return nil, fmt.Errorf("kernels/cuda: cublasCreate: %w", blasError(st))
	}
	return &blasHandle{h: h}, nil
}

func (b *blasHandle) destroy() {
	if b.lt != nil {
		b.lt.destroy()
	}
	C.spill_blas_destroy(b.h)
}

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

// ltHandle is a cuBLASLt handle and its plans by problem.
type ltHandle struct {
	h     C.cublasLtHandle_t
	plans map[ltKey]*ltPlan
}

// ltPlan is a matmul descriptor, its layouts and algorithm (C memory), or
// with c nil why cuBLASLt cannot do the problem.
type ltPlan struct {
	c   *C.spill_lt_plan
	ws  int64 // workspace bytes the algorithm needs
	err error
}

func newLtHandle() (*ltHandle, error) {
	var h C.cublasLtHandle_t
	if st := C.spill_lt_create(&h); st != 0 {
		return nil, fmt.Errorf("kernels/cuda: cublasLtCreate: %w", blasError(st))
	}
	return &ltHandle{h: h, plans: map[ltKey]*ltPlan{}}, nil
}

func (l *ltHandle) destroy() {
	for k := range l.plans {
		l.drop(k, nil)
	}
	C.spill_lt_destroy(l.h)
}

// drop frees the plan of k and, with err non-nil, records that k failed.
func (l *ltHandle) drop(k ltKey, err error) {
	if p := l.plans[k]; p != nil && p.c != nil {
		C.spill_lt_plan_free(p.c)
	}
	if err == nil {
		delete(l.plans, k)
		return
	}
	l.plans[k] = &ltPlan{err: err}
}

// Epilogues of a cuBLASLt plan (SPILL_EPI_*).
const (
	epiBias     = C.SPILL_EPI_BIAS
	epiGeluBias = C.SPILL_EPI_GELU_BIAS
	epiDGelu    = C.SPILL_EPI_DGELU
	epiResid    = C.SPILL_EPI_RESID
	epiBiasRes  = C.SPILL_EPI_BIAS_RESID
)

// plan plans k (spill_lt_plan_make): biases and aux matrices aligned like bias
// and aux, at most maxWs bytes of workspace.
func (l *ltHandle) plan(k ltKey, bias, aux cu.DevicePtr, maxWs int64, reduced bool) (*ltPlan, error) {
	var p *C.spill_lt_plan
	st := C.spill_lt_plan_make(l.h, &p, C.int(k.epi), cbool(k.ta), cbool(k.tb), C.int(k.m), C.int(k.n), C.int(k.k),
		blasType(k.ab), C.int(k.lda), C.int(k.ldb), blasType(k.d), C.int(k.ldd), C.uint64_t(bias), C.uint64_t(aux),
		C.int64_t(k.ldAux), C.uint32_t(k.alA), C.uint32_t(k.alB), C.uint32_t(k.alC), C.uint32_t(k.alD), C.uint64_t(maxWs), cbool(reduced))
	if st != 0 {
		return nil, blasError(st)
	}
	return &ltPlan{c: p, ws: int64(C.spill_lt_plan_ws(p))}, nil
}

// matmul runs p with a workspace of p.ws bytes at ws.
func (l *ltHandle) matmul(p *ltPlan, a, b, d, bias, aux, ws cu.DevicePtr, s cu.Stream) error {
	st := C.spill_lt_matmul(l.h, p.c, C.uint64_t(a), C.uint64_t(b), C.uint64_t(d), C.uint64_t(bias), C.uint64_t(aux),
		C.uint64_t(ws), C.uintptr_t(uintptr(unsafe.Pointer(s.C()))))
	if st != 0 {
		return blasError(st)
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

// hostRegister page-locks n bytes of host memory at p for the driver
// (current context).
func hostRegister(p unsafe.Pointer, n int) error {
	if r := C.spill_host_register(p, C.size_t(n)); r != 0 {
		return fmt.Errorf("kernels/cuda: cuMemHostRegister(%d): %w", n, driverError(r))
	}
	return nil
}

func hostUnregister(p unsafe.Pointer) error {
	if r := C.spill_host_unregister(p); r != 0 {
		return fmt.Errorf("kernels/cuda: cuMemHostUnregister: %w", driverError(r))
	}
	return nil
}

// tensorMap3 encodes into out the tensor map of the bf16 array at x (w
// columns, t rows, b batches; boxes of 64 columns and rows rows) for the
// kernels that copy by bulk tensor copies: spill_tmap3. It allocates
// nothing: the driver writes a map on the C stack, copied into out.
func tensorMap3(out *[16]uint64, x cu.DevicePtr, w, t, b, rows int) error {
	if r := C.spill_tmap3(unsafe.Pointer(&out[0]), C.uint64_t(x), C.uint64_t(w), C.uint64_t(t), C.uint64_t(b),
		C.uint(rows)); r != 0 {
		return driverError(r)
	}
	return nil
}

// buildCUDAVersion is CUDA_VERSION of the headers this package was built with.
func buildCUDAVersion() int { return int(C.spill_cuda_version()) }

// driverInit calls cuInit: nil when the driver has a usable device.
func driverInit() error {
	r := C.spill_cu_init()
	if r == 0 {
		return nil
	}
	msg := C.GoString(C.spill_cu_error(r))
	if m, ok := initErrors[int(r)]; ok && msg == "unknown error" {
		msg = m // the stub library cannot name its own errors
	}
	return fmt.Errorf("cuInit: %s (CUDA error %d)", msg, int(r))
}

// initErrors names the cuInit failures a machine without a working GPU
// gives (CUresult values of cuda.h).
var initErrors = map[int]string{
	34:  "the CUDA driver library is a stub (no NVIDIA driver installed)",
	35:  "the NVIDIA driver is older than this CUDA runtime",
	100: "no CUDA-capable device is detected",
}
