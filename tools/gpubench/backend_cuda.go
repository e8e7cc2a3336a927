//go:build cuda

package main

// A cuda build registers the CUDA backend ("cuda") and reports its host
// statistics per training step.
import "github.com/spill-ml/spill/kernels/cuda"

func init() { hostStats, hostWait = cuda.HostStats, cuda.HostWait }
