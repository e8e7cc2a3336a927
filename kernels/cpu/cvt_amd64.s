//go:build amd64 && !purego

#include "textflag.h"

// func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eaxArg+0(FP), AX
	MOVL ecxArg+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func bf16ToF32AVX2(dst *float32, src *uint16, n int)
// Widening is a 16-bit shift of each element.
TEXT ·bf16ToF32AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX

bf16loop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       bf16loop
	VZEROUPPER
	RET

// func f32ToBF16AVX2(dst *uint16, src *float32, n int)
// As kernels.BF16FromF32: (x + 0x7fff + (x>>16)&1) >> 16, and for a NaN
// (|x| > 0x7f800000) (x>>16) | 0x40.
TEXT ·f32ToBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	SHRQ         $3, CX
	MOVL         $0x7fff, AX
	VMOVD        AX, X10
	VPBROADCASTD X10, Y10
	MOVL         $1, AX
	VMOVD        AX, X11
	VPBROADCASTD X11, Y11
	MOVL         $0x7fffffff, AX
	VMOVD        AX, X12
	VPBROADCASTD X12, Y12
	MOVL         $0x7f800000, AX
	VMOVD        AX, X13
	VPBROADCASTD X13, Y13
	MOVL         $0x40, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14

tobf16loop:
	VMOVDQU      (SI), Y0
	VPSRLD       $16, Y0, Y1          // x>>16
	VPAND        Y11, Y1, Y2          // lowest kept bit
	VPADDD       Y10, Y0, Y3          // x + 0x7fff
	VPADDD       Y2, Y3, Y3           // + lsb
	VPSRLD       $16, Y3, Y3          // rounded
	VPOR         Y14, Y1, Y1          // quiet NaN
	VPAND        Y12, Y0, Y4          // |x|
	VPCMPGTD     Y13, Y4, Y4          // NaN mask
	VPBLENDVB    Y4, Y1, Y3, Y3
	VEXTRACTI128 $1, Y3, X5
	VPACKUSDW    X5, X3, X3           // 8 dwords <= 0xffff to 8 words
	VMOVDQU      X3, (DI)
	ADDQ         $32, SI
	ADDQ         $16, DI
	DECQ         CX
	JNZ          tobf16loop
	VZEROUPPER
	RET

// func f16ToF32F16C(dst *float32, src *uint16, n int)
TEXT ·f16ToF32F16C(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX

f16loop:
	VCVTPH2PS (SI), Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       f16loop
	VZEROUPPER
	RET

// func f32ToF16F16C(dst *uint16, src *float32, n int)
// Immediate 0: round to nearest even, whatever MXCSR says.
TEXT ·f32ToF16F16C(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX

tof16loop:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU   X1, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       tof16loop
	VZEROUPPER
	RET
