//go:build amd64 && !purego

#include "textflag.h"

// ADAMW_CONSTS broadcasts the step's constants (*adamConsts at AX) into
// Y6-Y15.
#define ADAMW_CONSTS \
	VBROADCASTSS 0(AX), Y6   \ // gs
	VBROADCASTSS 4(AX), Y7   \ // b1
	VBROADCASTSS 8(AX), Y8   \ // 1-b1
	VBROADCASTSS 12(AX), Y9  \ // b2
	VBROADCASTSS 16(AX), Y10 \ // 1-b2
	VBROADCASTSS 20(AX), Y11 \ // 1/c1
	VBROADCASTSS 24(AX), Y12 \ // 1/c2
	VBROADCASTSS 28(AX), Y13 \ // lr
	VBROADCASTSS 32(AX), Y14 \ // eps
	VBROADCASTSS 36(AX), Y15   // wd

// ADAMW8 updates 8 lanes in the operation order of adamwGo (no FMA, so
// the results are identical): the gradient at (SI), the moments and the
// parameters read from m0, v0 and p0 and written to m1, v1 and p1, the
// moments with the store instruction MST.
#define ADAMW8(m0, v0, p0, MST, m1, v1, p1) \
	VMULPS  (SI), Y6, Y0 \ // g = grad*gs
	VMULPS  m0, Y7, Y1   \ // b1*m
	VMULPS  Y0, Y8, Y2   \ // (1-b1)*g
	VADDPS  Y2, Y1, Y1   \ // m
	MST     Y1, m1       \
	VMULPS  Y0, Y0, Y3   \ // g*g
	VMULPS  Y3, Y10, Y3  \ // (1-b2)*(g*g)
	VMULPS  v0, Y9, Y2   \ // b2*v
	VADDPS  Y3, Y2, Y2   \ // v
	MST     Y2, v1       \
	VMULPS  Y2, Y12, Y2  \ // v/c2
	VSQRTPS Y2, Y2       \
	VADDPS  Y14, Y2, Y2  \ // + eps
	VMULPS  Y1, Y11, Y1  \ // m/c1
	VDIVPS  Y2, Y1, Y1   \ // mhat/den
	VMOVUPS p0, Y4       \ // p
	VMULPS  Y4, Y15, Y5  \ // wd*p
	VADDPS  Y5, Y1, Y1   \ // upd
	VMULPS  Y1, Y13, Y1  \ // lr*upd
	VSUBPS  Y1, Y4, Y4   \ // p - lr*upd
	VMOVUPS Y4, p1

// func adamwAVX2(par, grd, mom, vel *float32, n int, cst *adamConsts)
// Same operation order as adamwGo; no FMA, so results are identical.
TEXT ·adamwAVX2(SB), NOSPLIT, $0-48
	MOVQ par+0(FP), DI
	MOVQ grd+8(FP), SI
	MOVQ mom+16(FP), R8
	MOVQ vel+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ cst+40(FP), AX
	ADAMW_CONSTS
	SHRQ $3, CX
	JZ   done

loop:
	ADAMW8((R8), (R9), (DI), VMOVUPS, (R8), (R9), (DI))
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, R9
	DECQ CX
	JNZ  loop

done:
	VZEROUPPER
	RET

// func adamwFromAVX2(par, grd, mom, vel, p0, m0, v0 *float32, n int, cst *adamConsts)
// adamwAVX2 out of place: reads the state from p0, m0 and v0 and writes it
// to par, mom and vel, the same operations in the same order (ADAMW8). The
// moments are stored non-temporally (mom and vel must be 32-byte aligned):
// nothing reads them soon, and the stores then skip the read for
// ownership. The parameters are stored normally, for the caller to round
// them into the compute copy while they are in cache.
TEXT ·adamwFromAVX2(SB), NOSPLIT, $0-72
	MOVQ par+0(FP), DI
	MOVQ grd+8(FP), SI
	MOVQ mom+16(FP), R8
	MOVQ vel+24(FP), R9
	MOVQ p0+32(FP), R10
	MOVQ m0+40(FP), R11
	MOVQ v0+48(FP), R12
	MOVQ n+56(FP), CX
	MOVQ cst+64(FP), AX
	ADAMW_CONSTS
	SHRQ $3, CX
	JZ   fromdone

fromloop:
	ADAMW8((R11), (R12), (R10), VMOVNTPS, (R8), (R9), (DI))
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, R9
	ADDQ $32, R10
	ADDQ $32, R11
	ADDQ $32, R12
	DECQ CX
	JNZ  fromloop

fromdone:
	SFENCE
	VZEROUPPER
	RET
