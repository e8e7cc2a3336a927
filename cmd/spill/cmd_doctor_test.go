//go:build !cuda

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Without the cuda tag, doctor must fail clearly with exit status 1.
func TestDoctorWithoutCUDA(t *testing.T) {
	var out, errb bytes.Buffer
	code := runMain(context.Background(), []string{"doctor"}, &out, &errb)
	if code != exitFailure {
		t.Fatalf("exit %d, want %d; stderr %q", code, exitFailure, errb.String())
	}
	if !strings.Contains(errb.String(), "without CUDA") {
		t.Errorf("stderr %q does not say spill was built without CUDA", errb.String())
	}
}
