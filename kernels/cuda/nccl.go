//go:build cuda

package cuda

// NCCL, loaded at run time: a cuda build neither needs NCCL to compile nor
// to start, so single-GPU training works where NCCL is not installed; the
// first NewCommID or OpenComm opens libnccl.so.2 (the file named by
// SPILL_NCCL_LIBRARY, else the dynamic linker's search: LD_LIBRARY_PATH,
// the system's libnccl2). The few declarations below follow nccl.h of
// NCCL 2.x, whose ABI is stable; when nccl.h is on the include path
// (tools/cuda/env.sh adds the one that comes with PyTorch's wheel) the
// build checks them against it.

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cuda.h>

#define SPILL_NCCL_ID_BYTES 128
#define SPILL_NCCL_UINT8 1
#define SPILL_NCCL_FLOAT16 6
#define SPILL_NCCL_FLOAT32 7
#define SPILL_NCCL_BFLOAT16 9
#define SPILL_NCCL_SUM 0

#if __has_include(<nccl.h>)
#include <nccl.h>
typedef ncclResult_t spill_nres;
typedef ncclDataType_t spill_ndt;
typedef ncclRedOp_t spill_nop;
typedef ncclComm_t spill_ncomm;
typedef ncclUniqueId spill_nid;
typedef cudaStream_t spill_nstream;
_Static_assert(sizeof(ncclUniqueId) == SPILL_NCCL_ID_BYTES, "ncclUniqueId size");
_Static_assert(ncclUint8 == SPILL_NCCL_UINT8 && ncclFloat16 == SPILL_NCCL_FLOAT16 &&
	ncclFloat32 == SPILL_NCCL_FLOAT32 && ncclBfloat16 == SPILL_NCCL_BFLOAT16 && ncclSum == SPILL_NCCL_SUM,
	"NCCL enum values");
#define SPILL_NCCL_CHECK(name, type) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(&name), type), #name " prototype");
#else
typedef int spill_nres;
typedef int spill_ndt;
typedef int spill_nop;
typedef struct ncclComm *spill_ncomm;
typedef struct { char internal[SPILL_NCCL_ID_BYTES]; } spill_nid;
typedef CUstream spill_nstream;
#define SPILL_NCCL_CHECK(name, type)
#endif

typedef spill_nres (*spill_get_version_fn)(int *);
typedef spill_nres (*spill_get_unique_id_fn)(spill_nid *);
typedef spill_nres (*spill_comm_init_rank_fn)(spill_ncomm *, int, spill_nid, int);
typedef spill_nres (*spill_comm_fn)(spill_ncomm);
typedef const char *(*spill_get_error_string_fn)(spill_nres);
typedef const char *(*spill_get_last_error_fn)(spill_ncomm);
typedef spill_nres (*spill_all_reduce_fn)(const void *, void *, size_t, spill_ndt, spill_nop, spill_ncomm, spill_nstream);
typedef spill_nres (*spill_reduce_scatter_fn)(const void *, void *, size_t, spill_ndt, spill_nop, spill_ncomm, spill_nstream);
typedef spill_nres (*spill_all_gather_fn)(const void *, void *, size_t, spill_ndt, spill_ncomm, spill_nstream);
typedef spill_nres (*spill_broadcast_fn)(const void *, void *, size_t, spill_ndt, int, spill_ncomm, spill_nstream);
typedef spill_nres (*spill_group_fn)(void);

SPILL_NCCL_CHECK(ncclGetVersion, spill_get_version_fn)
SPILL_NCCL_CHECK(ncclGetUniqueId, spill_get_unique_id_fn)
SPILL_NCCL_CHECK(ncclCommInitRank, spill_comm_init_rank_fn)
SPILL_NCCL_CHECK(ncclCommDestroy, spill_comm_fn)
SPILL_NCCL_CHECK(ncclCommAbort, spill_comm_fn)
SPILL_NCCL_CHECK(ncclGetErrorString, spill_get_error_string_fn)
SPILL_NCCL_CHECK(ncclGetLastError, spill_get_last_error_fn)
SPILL_NCCL_CHECK(ncclAllReduce, spill_all_reduce_fn)
SPILL_NCCL_CHECK(ncclReduceScatter, spill_reduce_scatter_fn)
SPILL_NCCL_CHECK(ncclAllGather, spill_all_gather_fn)
SPILL_NCCL_CHECK(ncclBroadcast, spill_broadcast_fn)

static struct {
	spill_get_version_fn get_version;
	spill_get_unique_id_fn get_unique_id;
	spill_comm_init_rank_fn comm_init_rank;
	spill_comm_fn comm_destroy, comm_abort;
	spill_get_error_string_fn get_error_string;
	spill_get_last_error_fn get_last_error; // NULL before NCCL 2.13
	spill_all_reduce_fn all_reduce;
	spill_reduce_scatter_fn reduce_scatter;
	spill_all_gather_fn all_gather;
	spill_broadcast_fn broadcast;
	spill_group_fn group_start, group_end;
} spill_nccl;

// spill_nccl_load opens the library at path and resolves the entry points.
// It returns NULL, or what went wrong (valid until the next dl call; the
// caller copies it at once). Called once, under Go's sync.Once.
static const char *spill_nccl_load(const char *path) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) return dlerror();
#define SPILL_SYM(field, name) \
	if ((*(void **)&spill_nccl.field = dlsym(h, name)) == NULL) return "symbol " name " missing";
	SPILL_SYM(get_version, "ncclGetVersion")
	SPILL_SYM(get_unique_id, "ncclGetUniqueId")
	SPILL_SYM(comm_init_rank, "ncclCommInitRank")
	SPILL_SYM(comm_destroy, "ncclCommDestroy")
	SPILL_SYM(comm_abort, "ncclCommAbort")
	SPILL_SYM(get_error_string, "ncclGetErrorString")
	SPILL_SYM(all_reduce, "ncclAllReduce")
	SPILL_SYM(reduce_scatter, "ncclReduceScatter")
	SPILL_SYM(all_gather, "ncclAllGather")
	SPILL_SYM(broadcast, "ncclBroadcast")
	SPILL_SYM(group_start, "ncclGroupStart")
	SPILL_SYM(group_end, "ncclGroupEnd")
#undef SPILL_SYM
	*(void **)&spill_nccl.get_last_error = dlsym(h, "ncclGetLastError");
	return NULL;
}

static int spill_nccl_version(int *v) { return (int)spill_nccl.get_version(v); }

static int spill_nccl_unique_id(char *out) {
	spill_nid id;
	int r = (int)spill_nccl.get_unique_id(&id);
	if (r == 0) memcpy(out, &id, sizeof id);
	return r;
}

static int spill_nccl_init_rank(uintptr_t *comm, int n, const char *idb, int rank) {
	spill_nid id;
	spill_ncomm c = NULL;
	memcpy(&id, idb, sizeof id);
	int r = (int)spill_nccl.comm_init_rank(&c, n, id, rank);
	*comm = (uintptr_t)c;
	return r;
}

static int spill_nccl_destroy(uintptr_t c) { return (int)spill_nccl.comm_destroy((spill_ncomm)c); }
static int spill_nccl_abort(uintptr_t c) { return (int)spill_nccl.comm_abort((spill_ncomm)c); }

static const char *spill_nccl_error(int r) { return spill_nccl.get_error_string((spill_nres)r); }

static const char *spill_nccl_last_error(uintptr_t c) {
	if (spill_nccl.get_last_error == NULL || c == 0) return "";
	return spill_nccl.get_last_error((spill_ncomm)c);
}

static int spill_nccl_all_reduce(uint64_t s, uint64_t d, size_t n, int dt, uintptr_t c, uintptr_t st) {
	return (int)spill_nccl.all_reduce((const void *)(uintptr_t)s, (void *)(uintptr_t)d, n, (spill_ndt)dt,
		(spill_nop)SPILL_NCCL_SUM, (spill_ncomm)c, (spill_nstream)st);
}

static int spill_nccl_reduce_scatter(uint64_t s, uint64_t d, size_t n, int dt, uintptr_t c, uintptr_t st) {
	return (int)spill_nccl.reduce_scatter((const void *)(uintptr_t)s, (void *)(uintptr_t)d, n, (spill_ndt)dt,
		(spill_nop)SPILL_NCCL_SUM, (spill_ncomm)c, (spill_nstream)st);
}

static int spill_nccl_all_gather(uint64_t s, uint64_t d, size_t n, int dt, uintptr_t c, uintptr_t st) {
	return (int)spill_nccl.all_gather((const void *)(uintptr_t)s, (void *)(uintptr_t)d, n, (spill_ndt)dt,
		(spill_ncomm)c, (spill_nstream)st);
}

static int spill_nccl_broadcast(uint64_t s, uint64_t d, size_t n, int dt, int root, uintptr_t c, uintptr_t st) {
	return (int)spill_nccl.broadcast((const void *)(uintptr_t)s, (void *)(uintptr_t)d, n, (spill_ndt)dt, root,
		(spill_ncomm)c, (spill_nstream)st);
}

static int spill_nccl_group_start(void) { return (int)spill_nccl.group_start(); }
static int spill_nccl_group_end(void) { return (int)spill_nccl.group_end(); }
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/spill-ml/spill/kernels"
)

var _ kernels.CommOpener = (*Backend)(nil)

// ncclLibraryEnv names the variable that gives the path of libnccl.so.2.
const ncclLibraryEnv = "SPILL_NCCL_LIBRARY"

var nccl struct {
	once    sync.Once
	err     error
	version int // NCCL_VERSION_CODE, e.g. 22703 for 2.27.3
}

// loadNCCL opens the library once. Before that it sets NCCL_NVLS_ENABLE=0
// unless the user set it: NVLink multicast (NVLS) is to stay off on the
// machines spill runs on, and NCCL reads the variable at its first use.
func loadNCCL() error {
	nccl.once.Do(func() {
		if _, set := os.LookupEnv("NCCL_NVLS_ENABLE"); !set {
			_ = os.Setenv("NCCL_NVLS_ENABLE", "0")
		}
		path := os.Getenv(ncclLibraryEnv)
		names := []string{path}
		if path == "" {
			names = []string{"libnccl.so.2", "libnccl.so"}
		}
		var msgs []string
		for _, name := range names {
			cs := C.CString(name)
			msg := C.spill_nccl_load(cs)
			C.free(unsafe.Pointer(cs))
			if msg == nil {
				var v C.int
				if r := C.spill_nccl_version(&v); r != 0 {
					nccl.err = ncclError("ncclGetVersion", r, 0)
					return
				}
				nccl.version = int(v)
				return
			}
			msgs = append(msgs, C.GoString(msg))
		}
		hint := "install NCCL (libnccl2) or set " + ncclLibraryEnv + " to the path of libnccl.so.2 " +
			"(source tools/cuda/env.sh finds the one of PyTorch's wheel)"
		if path != "" {
			hint = "check " + ncclLibraryEnv
		}
		nccl.err = fmt.Errorf("kernels/cuda: NCCL not available: %s; %s", strings.Join(msgs, "; "), hint)
	})
	return nccl.err
}

// NCCLVersion reports the version of the NCCL library ("2.27.3"),
// loading it if needed.
func NCCLVersion() (string, error) {
	if err := loadNCCL(); err != nil {
		return "", err
	}
	v := nccl.version
	return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100), nil
}

// NCCLError is a failed NCCL call.
type NCCLError struct {
	Op     string // the NCCL function, "ncclAllReduce"
	Code   int    // ncclResult_t
	Msg    string // ncclGetErrorString
	Detail string // ncclGetLastError, when there is one
}

func (e *NCCLError) Error() string {
	s := fmt.Sprintf("kernels/cuda: %s: %s (NCCL error %d)", e.Op, e.Msg, e.Code)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// ncclError maps a result other than ncclSuccess to an *NCCLError; comm,
// when not 0, adds its last error message.
func ncclError(op string, r C.int, comm uintptr) error {
	if r == 0 {
		return nil
	}
	return &NCCLError{Op: op, Code: int(r), Msg: C.GoString(C.spill_nccl_error(r)),
		Detail: strings.TrimSpace(C.GoString(C.spill_nccl_last_error(C.uintptr_t(comm))))}
}

// NewCommID returns a new NCCL unique id (128 bytes). It holds the address
// where this process's NCCL listens for the other ranks, so it is made on
// rank 0 and sent to the others.
func (b *Backend) NewCommID() ([]byte, error) {
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	id := make([]byte, C.SPILL_NCCL_ID_BYTES)
	err := b.pool.call(func() error {
		return ncclError("ncclGetUniqueId", C.spill_nccl_unique_id((*C.char)(unsafe.Pointer(&id[0]))), 0)
	})
	if err != nil {
		return nil, err
	}
	return id, nil
}

// OpenComm joins NCCL communicator id as rank of size on this backend's
// device (ncclCommInitRank, which blocks until every rank has joined). If
// ctx is done first, OpenComm returns its error at once; the abandoned
// initialisation goes on in the background (NCCL's own bootstrap timeout
// ends it, or the process's exit) and its communicator, if it completes,
// is aborted.
func (b *Backend) OpenComm(ctx context.Context, id []byte, rank, size int) (kernels.Comm, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("kernels/cuda: OpenComm: rank %d of %d ranks is out of range", rank, size)
	}
	if len(id) != C.SPILL_NCCL_ID_BYTES {
		return nil, fmt.Errorf("kernels/cuda: OpenComm: an NCCL unique id has %d bytes, got %d", C.SPILL_NCCL_ID_BYTES, len(id))
	}
	if err := loadNCCL(); err != nil {
		return nil, err
	}
	if b.closed.Load() {
		return nil, errClosed
	}
	type result struct {
		h   uintptr
		err error
	}
	done := make(chan result, 1)
	idc := C.CBytes(id)
	// A goroutine of its own rather than one of the pool: the backend's
	// Close waits for the pool, and an abandoned init may never return.
	go func() {
		defer C.free(idc)
		if err := lockToContext(b.ctx); err != nil {
			done <- result{0, err}
			return
		}
		var h C.uintptr_t
		r := C.spill_nccl_init_rank(&h, C.int(size), (*C.char)(idc), C.int(rank))
		done <- result{uintptr(h), ncclError("ncclCommInitRank", r, 0)}
		// The goroutine ends locked to its thread, which ends with it.
	}()
	select {
	case res := <-done:
		if res.err != nil {
			return nil, fmt.Errorf("kernels/cuda: rank %d of %d: %w", rank, size, res.err)
		}
		return &ncclComm{b: b, h: res.h, rank: rank, size: size}, nil
	case <-ctx.Done():
		go func() {
			if res := <-done; res.err == nil {
				_ = b.pool.call(func() error { C.spill_nccl_abort(C.uintptr_t(res.h)); return nil })
			}
		}()
		return nil, fmt.Errorf("kernels/cuda: OpenComm: rank %d of %d waiting for the other ranks: %w", rank, size, ctx.Err())
	}
}

// ncclComm is a kernels.Comm on an NCCL communicator. Collectives are
// issued on the goroutine of the queue they are enqueued on (the thread
// with the device's context current), on its stream; so are GroupStart and
// GroupEnd, NCCL groups being per thread.
type ncclComm struct {
	b          *Backend
	rank, size int

	// mu is held for reading by every NCCL call on the communicator and
	// for writing by Abort and Close, which end it (h = 0).
	mu sync.RWMutex
	h  uintptr // ncclComm_t; 0 once aborted or closed

	gmu   sync.Mutex
	group *queue // queue of the open group, or nil
}

var _ kernels.Comm = (*ncclComm)(nil)

func (c *ncclComm) Rank() int { return c.rank }
func (c *ncclComm) Size() int { return c.size }

// ncclType maps a dtype to NCCL's: the float types for sums; for the
// copies (AllGather, Broadcast) every other dtype travels as bytes.
func ncclType(dt kernels.DType, sum bool) (C.int, int) {
	switch dt {
	case kernels.F32:
		return C.SPILL_NCCL_FLOAT32, 1
	case kernels.BF16:
		return C.SPILL_NCCL_BFLOAT16, 1
	case kernels.F16:
		return C.SPILL_NCCL_FLOAT16, 1
	}
	if sum {
		panic(fmt.Sprintf("kernels/cuda: NCCL sum of %v", dt))
	}
	return C.SPILL_NCCL_UINT8, dt.Size()
}

// collective enqueues call on q after the shared checks; call gets the
// communicator handle and q's stream.
func (c *ncclComm) collective(kq kernels.Queue, op string, dst, src kernels.Tensor, root int, call func(h, stream C.uintptr_t) C.int) {
	kernels.CheckCollective(op, dst, src, c.size, c.rank, root)
	q := c.b.queue(kq)
	c.gmu.Lock()
	defer c.gmu.Unlock()
	if c.group != nil && c.group != q {
		panic(fmt.Sprintf("kernels/cuda: %s on queue %s inside a group opened on queue %s", op, q.name, c.group.name))
	}
	// Pushed under gmu, so that collectives keep their call order.
	q.enqueue(func(q *queue) error {
		return c.issue("nccl"+op, func(h C.uintptr_t) C.int { return call(h, C.uintptr_t(q.cs)) })
	})
}

// issue makes one NCCL call with the communicator's handle.
func (c *ncclComm) issue(op string, f func(h C.uintptr_t) C.int) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.h == 0 {
		return fmt.Errorf("kernels/cuda: %s: %w", op, kernels.ErrCommAborted)
	}
	return ncclError(op, f(C.uintptr_t(c.h)), c.h)
}

// operand returns the device address of t, or 0 for the zero Tensor.
func (c *ncclComm) operand(op, name string, t kernels.Tensor) C.uint64_t {
	if t.IsZero() {
		return 0
	}
	return C.uint64_t(c.b.devPtr(t, op, name))
}

func (c *ncclComm) AllReduce(q kernels.Queue, dst, src kernels.Tensor) {
	d, s := c.operand("AllReduce", "dst", dst), c.operand("AllReduce", "src", src)
	dt, _ := ncclType(dst.DType, true)
	n := C.size_t(dst.N)
	c.collective(q, "AllReduce", dst, src, 0, func(h, st C.uintptr_t) C.int { return C.spill_nccl_all_reduce(s, d, n, dt, h, st) })
}

func (c *ncclComm) ReduceScatter(q kernels.Queue, dst, src kernels.Tensor) {
	d, s := c.operand("ReduceScatter", "dst", dst), c.operand("ReduceScatter", "src", src)
	dt, _ := ncclType(dst.DType, true)
	n := C.size_t(dst.N)
	c.collective(q, "ReduceScatter", dst, src, 0, func(h, st C.uintptr_t) C.int { return C.spill_nccl_reduce_scatter(s, d, n, dt, h, st) })
}

func (c *ncclComm) AllGather(q kernels.Queue, dst, src kernels.Tensor) {
	d, s := c.operand("AllGather", "dst", dst), c.operand("AllGather", "src", src)
	dt, per := ncclType(dst.DType, false)
	n := C.size_t(src.N * per)
	c.collective(q, "AllGather", dst, src, 0, func(h, st C.uintptr_t) C.int { return C.spill_nccl_all_gather(s, d, n, dt, h, st) })
}

func (c *ncclComm) Broadcast(q kernels.Queue, dst, src kernels.Tensor, root int) {
	d, s := c.operand("Broadcast", "dst", dst), c.operand("Broadcast", "src", src)
	if s == 0 {
		s = d // src is read on the root only; NCCL wants a pointer everywhere
	}
	dt, per := ncclType(dst.DType, false)
	n := C.size_t(dst.N * per)
	r := C.int(root)
	c.collective(q, "Broadcast", dst, src, root, func(h, st C.uintptr_t) C.int { return C.spill_nccl_broadcast(s, d, n, dt, r, h, st) })
}

func (c *ncclComm) GroupStart(kq kernels.Queue) {
	q := c.b.queue(kq)
	c.gmu.Lock()
	defer c.gmu.Unlock()
	if c.group != nil {
		panic(fmt.Sprintf("kernels/cuda: GroupStart inside a group (rank %d): groups do not nest", c.rank))
	}
	c.group = q
	q.enqueue(func(*queue) error { return ncclError("ncclGroupStart", C.spill_nccl_group_start(), 0) })
}

func (c *ncclComm) GroupEnd(kq kernels.Queue) {
	q := c.b.queue(kq)
	c.gmu.Lock()
	defer c.gmu.Unlock()
	if c.group != q {
		panic(fmt.Sprintf("kernels/cuda: GroupEnd on queue %s without a GroupStart on it (rank %d)", q.name, c.rank))
	}
	c.group = nil
	q.enqueue(func(*queue) error {
		c.mu.RLock()
		h := c.h
		c.mu.RUnlock()
		return ncclError("ncclGroupEnd", C.spill_nccl_group_end(), h)
	})
}

// end runs ncclCommAbort or ncclCommDestroy once, on a context goroutine.
// It waits for NCCL calls being issued on the communicator to return.
func (c *ncclComm) end(op string, f func(C.uintptr_t) C.int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h == 0 {
		return nil
	}
	h := c.h
	c.h = 0
	return c.b.pool.call(func() error { return ncclError(op, f(C.uintptr_t(h)), 0) })
}

// Abort aborts the communicator (ncclCommAbort): work of it still on the
// device stops, later collectives fail with kernels.ErrCommAborted.
func (c *ncclComm) Abort() error {
	return c.end("ncclCommAbort", func(h C.uintptr_t) C.int { return C.spill_nccl_abort(h) })
}

// Close destroys the communicator (ncclCommDestroy).
func (c *ncclComm) Close() error {
	return c.end("ncclCommDestroy", func(h C.uintptr_t) C.int { return C.spill_nccl_destroy(h) })
}
