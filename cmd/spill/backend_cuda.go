//go:build cuda

package main

// A cuda build registers the CUDA backend ("cuda") next to the CPU one.
import _ "github.com/spill-ml/spill/kernels/cuda"
