package cpu

import (
	"math"

	"github.com/spill-ml/spill/kernels"
)

// A packed, blocked matrix multiply, BLIS style: C(M,N) += A(M,K)·B(K,N).
// B is packed in blocks of kcBlk×ncBlk into panels of nr columns (shared by
// all workers), A in blocks of mcBlk×kcBlk into panels of mr rows (one per
// task), and a register-blocked micro-kernel computes each mr×nr tile of C
// from one A panel and one B panel. Packing reads operands of any float
// dtype through strides, so transposed and bf16/f16 operands are
// converted tile by tile, on the fly.
const (
	mr    = 6
	nr    = 16
	kcBlk = 256
	mcBlk = 72 // multiple of mr
	ncBlk = 2048
)

// operand is a matrix in a view: element (i, j) is at off + i*rs + j*cs.
type operand struct {
	v      view
	off    int
	rs, cs int
}

// gemm computes C += A·B for C(M,N) row-major with leading dimension ldc.
func (b *Backend) gemm(c []float32, ldc int, A, B operand, M, N, K int) {
	bp := getScratch(kcBlk * min(roundUp(N, nr), ncBlk))
	defer putScratch(bp)
	icBlocks := (M + mcBlk - 1) / mcBlk
	for jc := 0; jc < N; jc += ncBlk {
		nc := min(ncBlk, N-jc)
		panels := (nc + nr - 1) / nr
		for pc := 0; pc < K; pc += kcBlk {
			kc := min(kcBlk, K-pc)
			// Pack B[pc:pc+kc, jc:jc+nc], in parallel over panels.
			b.pool.parallel(panels, 4, func(lo, hi int) {
				for p := lo; p < hi; p++ {
					j0 := jc + p*nr
					packB(bp[p*kc*nr:(p+1)*kc*nr], B, pc, kc, j0, min(nr, jc+nc-j0))
				}
			})
			// Tasks: (block of rows) × (group of B panels).
			groups := max(1, min(panels, (4*b.threads+icBlocks-1)/icBlocks))
			per := (panels + groups - 1) / groups
			groups = (panels + per - 1) / per
			b.pool.run(icBlocks*groups, func(task int) {
				ib, g := task/groups, task%groups
				i0 := ib * mcBlk
				mc := min(mcBlk, M-i0)
				ap := getScratch(mcBlk * kcBlk)
				defer putScratch(ap)
				packA(ap, A, i0, mc, pc, kc)
				var tile [mr * nr]float32
				for p := g * per; p < min((g+1)*per, panels); p++ {
					j0 := jc + p*nr
					nw := min(nr, jc+nc-j0)
					bpan := bp[p*kc*nr : (p+1)*kc*nr]
					for ir := 0; ir < mc; ir += mr {
						mh := min(mr, mc-ir)
						apan := ap[ir*kc : ir*kc+kc*mr]
						if mh == mr && nw == nr {
							kernel(kc, apan, bpan, c[(i0+ir)*ldc+j0:], ldc)
							continue
						}
						clear(tile[:])
						kernel(kc, apan, bpan, tile[:], nr)
						for i := 0; i < mh; i++ {
							row := c[(i0+ir+i)*ldc+j0:][:nw]
							for j := range row {
								row[j] += tile[i*nr+j]
							}
						}
					}
				}
			})
		}
	}
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// packA packs rows [i0, i0+mc) and columns [k0, k0+kc) of A into panels of
// mr rows: panel q holds, for each k, the mr values of rows q*mr.. (zero
// padded).
func packA(dst []float32, A operand, i0, mc, k0, kc int) {
	for q := 0; q*mr < mc; q++ {
		pan := dst[q*mr*kc : (q+1)*mr*kc]
		rows := min(mr, mc-q*mr)
		for i := 0; i < mr; i++ {
			if i >= rows {
				for p := 0; p < kc; p++ {
					pan[p*mr+i] = 0
				}
				continue
			}
			base := A.off + (i0+q*mr+i)*A.rs + k0*A.cs
			gather(pan[i:], mr, A.v, base, A.cs, kc)
		}
	}
}

// packB packs rows [k0, k0+kc) and columns [j0, j0+nw) of B into one
// panel: for each k, nr values (zero padded).
func packB(dst []float32, B operand, k0, kc, j0, nw int) {
	for j := 0; j < nr; j++ {
		if j >= nw {
			for p := 0; p < kc; p++ {
				dst[p*nr+j] = 0
			}
			continue
		}
		base := B.off + k0*B.rs + (j0+j)*B.cs
		gather(dst[j:], nr, B.v, base, B.rs, kc)
	}
}

// gather sets dst[p*dstride] = v[base + p*stride] for p in [0, n),
// converting to float32.
func gather(dst []float32, dstride int, v view, base, stride, n int) {
	switch v.dt {
	case kernels.F32:
		src := v.f
		for p := 0; p < n; p++ {
			dst[p*dstride] = src[base+p*stride]
		}
	case kernels.BF16:
		src := v.h
		for p := 0; p < n; p++ {
			dst[p*dstride] = math.Float32frombits(uint32(src[base+p*stride]) << 16)
		}
	default:
		src := v.h
		for p := 0; p < n; p++ {
			dst[p*dstride] = kernels.F32FromF16(src[base+p*stride])
		}
	}
}

// kernelGo is the portable micro-kernel: c[i*ldc+j] += Σ_p a[p*mr+i]·b[p*nr+j]
// for the full mr×nr tile.
func kernelGo(k int, a, b, c []float32, ldc int) {
	var acc [mr][nr]float32
	a = a[:k*mr]
	b = b[:k*nr]
	for p := 0; p < k; p++ {
		bp := (*[nr]float32)(b[p*nr : p*nr+nr])
		ap := (*[mr]float32)(a[p*mr : p*mr+mr])
		for i := 0; i < mr; i++ {
			ai := ap[i]
			row := &acc[i]
			for j := 0; j < nr; j++ {
				row[j] += ai * bp[j]
			}
		}
	}
	for i := 0; i < mr; i++ {
		row := c[i*ldc : i*ldc+nr]
		for j := range row {
			row[j] += acc[i][j]
		}
	}
}

// gemmNT sets y(M,N) = x(M,K)·w(N,K)ᵀ + bias(N) (bias may be absent),
// x starting at element xoff of its view.
func (b *Backend) gemmNT(y []float32, x view, xoff int, w view, bias []float32, M, K, N int) {
	b.pool.parallel(M, max(1, 16384/N), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := y[r*N : r*N+N]
			if bias != nil {
				copy(row, bias[:N])
			} else {
				clear(row)
			}
		}
	})
	b.gemm(y, N, operand{v: x, off: xoff, rs: K, cs: 1}, operand{v: w, rs: 1, cs: K}, M, N, K)
}

// gemmNN accumulates d(M,N) += g(M,K)·w(K,N).
func (b *Backend) gemmNN(d []float32, g, w view, M, K, N int) {
	b.gemm(d, N, operand{v: g, rs: K, cs: 1}, operand{v: w, rs: N, cs: 1}, M, N, K)
}

// gemmTN accumulates d(M,N) += g(K,M)ᵀ·x(K,N).
func (b *Backend) gemmTN(d []float32, g, x view, K, M, N int) {
	b.gemm(d, N, operand{v: g, rs: 1, cs: M}, operand{v: x, rs: N, cs: 1}, M, N, K)
}
