package cuda

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestSM90FwdDepths checks that the ring depths the Go side sizes shared
// memory for (sm90FwdPDepth, sm90FwdPx1Depth, sm90p4Of) are the defaults
// of kernels/flashattn_sm90.cu (F9_FWD3_D64, F9_FWD3_D128, the depth of
// the flash_fwd3x1 entry points, F9_FWD4_D64, F9_FWD4_D128): a deeper
// ring in the .cu alone would overrun the dynamic shared memory. Reads
// the source; needs no GPU.
func TestSM90FwdDepths(t *testing.T) {
	src, err := os.ReadFile("kernels/flashattn_sm90.cu")
	if err != nil {
		t.Fatal(err)
	}
	def := func(name string) int {
		m := regexp.MustCompile(`(?m)^#define ` + name + ` (\d+)$`).FindSubmatch(src)
		if m == nil {
			t.Fatalf("flashattn_sm90.cu: no #define %s N", name)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	x1 := regexp.MustCompile(`(?m)^F9_FWD3\(flash_fwd3x1_sm90_bf16_hs(\d+), \d+, 1, (\d+),`).FindAllSubmatch(src, -1)
	if len(x1) != 2 {
		t.Fatalf("flashattn_sm90.cu: %d flash_fwd3x1 entry points, want 2", len(x1))
	}
	for _, m := range x1 {
		if d, _ := strconv.Atoi(string(m[2])); d != sm90FwdPx1Depth {
			t.Errorf("flash_fwd3x1_sm90_bf16_hs%s: depth %d in the .cu, sm90FwdPx1Depth %d", m[1], d, sm90FwdPx1Depth)
		}
	}
	for _, c := range []struct {
		name    string
		got, hs int
	}{{"F9_FWD3_D64", sm90FwdPDepth(64), 64}, {"F9_FWD3_D128", sm90FwdPDepth(128), 128},
		{"F9_FWD4_D64", sm90p4Of(64, sm90p4Pair).depth, 64}, {"F9_FWD4_D64", sm90p4Of(64, sm90p4Wide).depth, 64},
		{"F9_FWD4_D128", sm90p4Of(128, sm90p4Pair).depth, 128}, {"F9_FWD4_D128", sm90p4Of(128, sm90p4Wide).depth, 128}} {
		if want := def(c.name); c.got != want {
			t.Errorf("%s is %d in flashattn_sm90.cu, the Go side sizes hs %d for %d", c.name, want, c.hs, c.got)
		}
	}
}

// TestSM90WSKernels holds sm90wsKernels to the F9_FWD5 entry points of
// kernels/flashattn_sm90.cu (name, head size, warpgroups, ring depth and
// keys per tile), so that the Go side's block size and shared memory are
// the kernels'. Reads the source; needs no GPU.
func TestSM90WSKernels(t *testing.T) {
	src, err := os.ReadFile("kernels/flashattn_sm90.cu")
	if err != nil {
		t.Fatal(err)
	}
	ms := regexp.MustCompile(`(?m)^F9_FWD5\((\w+), (\d+), (\d+), (\d+), (\d+), (true|false)\)$`).FindAllSubmatch(src, -1)
	if len(ms) != len(sm90wsKernels) {
		t.Fatalf("flashattn_sm90.cu: %d F9_FWD5 entry points, sm90wsKernels has %d", len(ms), len(sm90wsKernels))
	}
	for i, m := range ms {
		n := func(j int) int { v, _ := strconv.Atoi(string(m[j])); return v }
		got := sm90wsKernels[i]
		want := newSM90WS(got.env, string(m[1]), n(2), n(3), n(4), n(5), string(m[6]) == "true")
		if got != want {
			t.Errorf("F9_FWD5 line %d: %+v in the .cu, sm90wsKernels has %+v", i, want, got)
		}
	}
	for _, c := range []struct {
		hs   int
		v    string
		name string
	}{{64, "sm90ws", "flash_fwd5_sm90_bf16_hs64"}, {64, "sm90wsk", "flash_fwd5w3_sm90_bf16_hs64"},
		{64, "sm90wsp", "flash_fwd5p_sm90_bf16_hs64"}, {128, "sm90ws", "flash_fwd5_sm90_bf16_hs128"},
		{128, "sm90wsk", "flash_fwd5k_sm90_bf16_hs128"}, {128, "sm90wsp", "flash_fwd5p_sm90_bf16_hs128"}} {
		if k, ok := sm90wsOf(c.hs, c.v); !ok || k.name != c.name || k.hs != c.hs {
			t.Errorf("sm90wsOf(%d, %q) = %+v, %v; want %s", c.hs, c.v, k, ok, c.name)
		}
	}
	if _, ok := sm90wsOf(64, "sm90p"); ok {
		t.Error(`sm90wsOf(64, "sm90p") selects a flash_fwd5 kernel`)
	}
}

// TestFusedSM90WSKernels holds the warp-specialised modes of
// fusedSM90Modes to the F9_BWDFW entry points of kernels/flashattn_sm90.cu
// (name, head size and warpgroups), and every mode's shared memory and
// block to its kernels' shape, so that the launch matches the kernels.
// Reads the source; needs no GPU.
func TestFusedSM90WSKernels(t *testing.T) {
	src, err := os.ReadFile("kernels/flashattn_sm90.cu")
	if err != nil {
		t.Fatal(err)
	}
	ms := regexp.MustCompile(`(?m)^F9_BWDFW\((\w+), (\d+), (\d+), \d+\)$`).FindAllSubmatch(src, -1)
	type entry struct{ hs, wg int }
	cu := map[string]entry{}
	for _, m := range ms {
		hs, _ := strconv.Atoi(string(m[2]))
		wg, _ := strconv.Atoi(string(m[3]))
		cu[string(m[1])] = entry{hs, wg}
	}
	n := 0
	for _, m := range fusedSM90Modes {
		for k, name := range m.names {
			e, ok := cu[name]
			if ok != m.ws {
				t.Errorf("mode %s: kernel %s an F9_BWDFW entry point: %v, ws %v", m.mode, name, ok, m.ws)
				continue
			}
			if !ok {
				continue
			}
			n++
			if hs := 64 * (k + 1); e.hs != hs || e.wg != m.wg {
				t.Errorf("mode %s: %s has head size %d and %d warpgroups in the .cu, the table %d and %d", m.mode, name,
					e.hs, e.wg, hs, m.wg)
			}
		}
	}
	if n != len(ms) {
		t.Errorf("flashattn_sm90.cu: %d F9_BWDFW entry points, fusedSM90Modes names %d of them", len(ms), n)
	}
	// The launch: the producer's warpgroup and the mbarriers' 64 bytes more.
	for _, m := range fusedSM90Modes {
		rows, threads, smem := m.shape(128)
		wr, wt, ws := m.wg*flashRows, m.wg*flashThreads, sm90FusedSmem(128, m.wg, m.bulk, false)
		if m.ws {
			wt, ws = wt+flashThreads, ws+64 // f9_bwdws_smem's five mbarriers, rounded up
		}
		if rows != wr || threads != wt || smem != ws {
			t.Errorf("mode %s: shape(128) = %d rows, %d threads, %d bytes; want %d, %d, %d", m.mode, rows, threads, smem,
				wr, wt, ws)
		}
	}
}

// TestSM90BwdKernels holds sm90BwdNames to the entry points of
// kernels/flashattn_sm90.cu: every kernel it names for the Hopper split
// modes is an F9_BWD line (sm90, sm90p) or an F9_BWDW line (sm90w, whose
// dK, dV kernel is warp-specialised) of that head size. Reads the source;
// needs no GPU.
func TestSM90BwdKernels(t *testing.T) {
	src, err := os.ReadFile("kernels/flashattn_sm90.cu")
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		hs int
		ws bool
	}
	cu := map[string]entry{}
	for _, m := range regexp.MustCompile(`(?m)^F9_BWD\(\w+, (\w+), (\d+), (?:true|false), \d+\)$`).FindAllSubmatch(src, -1) {
		hs, _ := strconv.Atoi(string(m[2]))
		cu[string(m[1])] = entry{hs, false}
	}
	for _, m := range regexp.MustCompile(`(?m)^F9_BWDW\((\w+), (\d+)\)$`).FindAllSubmatch(src, -1) {
		hs, _ := strconv.Atoi(string(m[2]))
		cu[string(m[1])] = entry{hs, true}
	}
	for _, mode := range []string{flashBwdSM90, flashBwdSM90P, flashBwdSM90W} {
		for _, hs := range []int{64, 128} {
			kv, q := sm90BwdNames(hs, mode)
			if e, ok := cu[kv]; !ok || e.hs != hs || e.ws != (mode == flashBwdSM90W) {
				t.Errorf("sm90BwdNames(%d, %s): dK, dV kernel %s: in the .cu %v, %+v", hs, mode, kv, ok, e)
			}
			if e, ok := cu[q]; !ok || e.hs != hs || e.ws {
				t.Errorf("sm90BwdNames(%d, %s): dQ kernel %s: in the .cu %v, %+v", hs, mode, q, ok, e)
			}
		}
	}
}
