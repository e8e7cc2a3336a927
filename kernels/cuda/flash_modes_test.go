package cuda

import "testing"

// TestFlashBwdModeOf checks the parsing of SPILL_FLASH_BWD.
func TestFlashBwdModeOf(t *testing.T) {
	for in, want := range map[string]string{"": flashBwdAuto, "auto": flashBwdAuto, "fused": flashBwdFused, "split": flashBwdSplit,
		"sm90": flashBwdSM90, "sm90p": flashBwdSM90P, "sm90x": flashBwdAuto, "sm90f": flashBwdFusedSM90,
		"sm90f2": flashBwdFused2SM90, "sm90f2b": flashBwdFused2BSM90, "sm90f1b": flashBwdFused1BSM90,
		"sm90w": flashBwdSM90W, "sm90f1w": flashBwdFused1WSM90, "sm90f2w": flashBwdFused2WSM90, "sm90f1ws": flashBwdAuto,
		"fused-bq32": flashBwdAuto, "nonsense": flashBwdAuto, "split-smem": flashBwdSplitSM, "split-w8": flashBwdAuto} {
		if got := flashBwdModeOf(in); got != want {
			t.Errorf("flashBwdModeOf(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestFlashBwdModeAt checks the default backward's choice by head size and
// sequence length, and that an explicit mode is kept at every shape.
func TestFlashBwdModeAt(t *testing.T) {
	for _, c := range []struct {
		hs, T int
		mode  string
		want  string
	}{
		{64, 1024, flashBwdAuto, flashBwdSM90},
		{64, flashFused64MinT, flashBwdAuto, flashBwdSM90},
		{64, flashFused64MinT + 1, flashBwdAuto, flashBwdFused1WSM90},
		{64, 8192, flashBwdAuto, flashBwdFused1WSM90},
		{128, 1, flashBwdAuto, flashBwdSM90W},
		{128, flashFused128MinT, flashBwdAuto, flashBwdSM90W},
		{128, flashFused128MinT + 1, flashBwdAuto, flashBwdFused2BSM90},
		{128, flashFused128WST, flashBwdAuto, flashBwdFused2BSM90},
		{128, flashFused128WST + 1, flashBwdAuto, flashBwdFused2WSM90},
		{128, 8192, flashBwdAuto, flashBwdFused2WSM90},
		{80, 8192, flashBwdAuto, flashBwdSM90},
		{128, 8192, flashBwdSM90P, flashBwdSM90P},
		{64, 1024, flashBwdFused2BSM90, flashBwdFused2BSM90},
	} {
		if got := flashBwdModeAt(c.hs, c.T, c.mode); got != c.want {
			t.Errorf("flashBwdModeAt(%d, %d, %q) = %q, want %q", c.hs, c.T, c.mode, got, c.want)
		}
	}
}

// TestWSFallback checks that each warp-specialised mode gives way to the
// same kernels without the producer, and that the others stay.
func TestWSFallback(t *testing.T) {
	for in, want := range map[string]string{flashBwdSM90W: flashBwdSM90, flashBwdFused1WSM90: flashBwdFused1BSM90,
		flashBwdFused2WSM90: flashBwdFused2BSM90, flashBwdSM90: flashBwdSM90, flashBwdFused2BSM90: flashBwdFused2BSM90,
		flashBwdAuto: flashBwdAuto} {
		if got := wsFallback(in); got != want {
			t.Errorf("wsFallback(%q) = %q, want %q", in, got, want)
		}
	}
	for _, m := range fusedSM90Modes {
		if f, _ := fusedSM90ModeOf(wsFallback(m.mode)); f.ws || f.wg != m.wg || f.bulk != m.bulk {
			t.Errorf("wsFallback(%s) = %s: %+v", m.mode, f.mode, f)
		}
	}
}
