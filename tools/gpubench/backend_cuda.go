//go:build cuda

package main

// A cuda build registers the CUDA backend ("cuda").
import _ "github.com/spill-ml/spill/kernels/cuda"
