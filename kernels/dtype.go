package kernels

import "fmt"

// DType is the element type of a Tensor.
type DType uint8

// Element types.
const (
	F32  DType = iota + 1 // IEEE-754 binary32
	BF16                  // bfloat16: the top 16 bits of a binary32
	F16                   // IEEE-754 binary16
	I32                   // int32 (token ids, targets)
	U16                   // uint16 (stored tokens)
	U32                   // uint32 (stored tokens)
	U8                    // bytes
)

var dtypeInfo = [...]struct {
	name string
	size int
}{
	F32:  {"f32", 4},
	BF16: {"bf16", 2},
	F16:  {"f16", 2},
	I32:  {"i32", 4},
	U16:  {"u16", 2},
	U32:  {"u32", 4},
	U8:   {"u8", 1},
}

func (d DType) valid() bool { return d > 0 && int(d) < len(dtypeInfo) }

// Size is the size of one element in bytes.
func (d DType) Size() int {
	if !d.valid() {
		panic(fmt.Sprintf("kernels: invalid dtype %d", d))
	}
	return dtypeInfo[d].size
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d == F32 || d == BF16 || d == F16 }

func (d DType) String() string {
	if !d.valid() {
		return fmt.Sprintf("dtype(%d)", d)
	}
	return dtypeInfo[d].name
}

// ParseDType parses a dtype name. It accepts the short names printed by
// String and the common long spellings ("float32", "bfloat16", "float16",
// "fp32", "fp16", "int32", "uint16", "uint32", "uint8").
func ParseDType(s string) (DType, error) {
	switch s {
	case "f32", "fp32", "float32":
		return F32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "f16", "fp16", "float16", "half":
		return F16, nil
	case "i32", "int32":
		return I32, nil
	case "u16", "uint16":
		return U16, nil
	case "u32", "uint32":
		return U32, nil
	case "u8", "uint8", "byte":
		return U8, nil
	}
	return 0, fmt.Errorf("kernels: unknown dtype %q (want f32, bf16, f16, i32, u16, u32 or u8)", s)
}
