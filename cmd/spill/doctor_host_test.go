package main

import (
	"testing"

	"github.com/spill-ml/spill/kernels"
)

// measureHost runs the host optimizer over real state and reports rates.
func TestMeasureHost(t *testing.T) {
	be, err := kernels.Open("cpu", kernels.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	r, err := measureHost(be, 1<<18)
	if err != nil {
		t.Fatal(err)
	}
	if !(r.AdamGo > 0 && r.Finite > 0 && r.Copy > 0) {
		t.Fatalf("rates %+v: every measured rate must be positive", r)
	}
	if _, ok := be.(kernels.PinnedAllocator); ok && !(r.AdamPinned > 0) {
		t.Fatalf("rates %+v: the backend pins memory, the pinned rate must be measured", r)
	}
	t.Logf("%+v", r)
}
