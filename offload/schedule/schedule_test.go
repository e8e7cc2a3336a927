package schedule

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/spill-ml/spill/offload"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt")

// TestCompileData runs the cases of testdata/*.txt. Each case is a line of
// key=value settings, "----", and the expected dump of the program (ops,
// intervals, peak by class and traffic), ended by a blank line. Run with
// -rewrite to update the files after a deliberate change.
func TestCompileData(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txt")
	if len(files) == 0 {
		t.Fatal("no testdata")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		cases := strings.Split(strings.TrimSpace(string(data)), "\n\n")
		for _, c := range cases {
			cmd, want, _ := strings.Cut(c, "\n----")
			cmd = strings.TrimSpace(cmd)
			got, err := runCase(cmd)
			if err != nil {
				got = "error: " + err.Error() + "\n"
			}
			fmt.Fprintf(&out, "%s\n----\n%s\n", cmd, got)
			if !*rewrite && strings.TrimSpace(want) != strings.TrimSpace(got) {
				t.Errorf("%s: %s:\ngot:\n%s\nwant:\n%s", f, cmd, got, want)
			}
		}
		if *rewrite {
			if err := os.WriteFile(f, []byte(strings.TrimSuffix(out.String(), "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// parseSpec reads "layers=3 param=100 act=40 out=10 save=20 tied=2:0 mb=2 group=1
// weights=host grads=host acts=keep,recompute,keep prefetch=1
// opt=device,host,disk master=400 moment=400 train".
func parseSpec(cmd string) (Spec, error) {
	s := Spec{Weights: offload.TierHost, Grads: offload.TierHost, MicroBatches: 1}
	var n int
	param, act, out := []int64{100}, []int64{40}, []int64{10}
	var master, moment, save []int64
	var tied []string
	for _, f := range strings.Fields(cmd) {
		k, v, _ := strings.Cut(f, "=")
		ints := func() []int64 {
			var r []int64
			for _, x := range strings.Split(v, ",") {
				i, _ := strconv.ParseInt(x, 10, 64)
				r = append(r, i)
			}
			return r
		}
		switch k {
		case "layers":
			n = int(ints()[0])
		case "param":
			param = ints()
		case "act":
			act = ints()
		case "out":
			out = ints()
		case "tied":
			tied = strings.Split(v, ",")
		case "save":
			save = ints()
		case "master":
			master = ints()
		case "moment":
			moment = ints()
		case "opt":
			for _, a := range strings.Split(v, ",") {
				var t offload.Tier
				if err := t.UnmarshalText([]byte(a)); err != nil {
					return s, err
				}
				s.Optimizer = append(s.Optimizer, t)
			}
		case "mb":
			s.MicroBatches = int(ints()[0])
		case "group":
			s.Group = int(ints()[0])
		case "prefetch":
			s.Prefetch = int(ints()[0])
		case "weights":
			if err := s.Weights.UnmarshalText([]byte(v)); err != nil {
				return s, err
			}
		case "grads":
			if err := s.Grads.UnmarshalText([]byte(v)); err != nil {
				return s, err
			}
		case "acts":
			for _, a := range strings.Split(v, ",") {
				var p offload.ActPolicy
				if err := p.UnmarshalText([]byte(a)); err != nil {
					return s, err
				}
				s.Acts = append(s.Acts, p)
			}
		case "train":
			s.Train = true
		default:
			return s, fmt.Errorf("unknown setting %q", k)
		}
	}
	pick := func(v []int64, i int) int64 { return v[min(i, len(v)-1)] }
	for i := 0; i < n; i++ {
		l := Layer{ParamBytes: pick(param, i), ActBytes: pick(act, i), OutBytes: pick(out, i)}
		if master != nil {
			l.MasterBytes = pick(master, i)
		}
		if save != nil {
			l.SaveBytes = pick(save, i)
		}
		if moment != nil {
			l.MomentBytes = pick(moment, i)
		} else {
			l.MomentBytes = 4 * l.ParamBytes
		}
		if i == n-1 {
			l.OutBytes = 0
		}
		s.Layers = append(s.Layers, l)
	}
	for _, t := range tied {
		a, b, _ := strings.Cut(t, ":")
		i, _ := strconv.Atoi(a)
		j, _ := strconv.Atoi(b)
		if i < n {
			s.Layers[i].Tied = append(s.Layers[i].Tied, j)
		}
	}
	return s, nil
}

func runCase(cmd string) (string, error) {
	s, err := parseSpec(cmd)
	if err != nil {
		return "", err
	}
	p, err := Compile(s)
	if err != nil {
		return "", err
	}
	peak, by := p.Peak()
	var classes []string
	for c, n := range by {
		classes = append(classes, fmt.Sprintf("%s=%d", c, n))
	}
	sort.Strings(classes)
	tr := p.Traffic()
	return fmt.Sprintf("%speak %d %s\ntraffic h2d %d d2h %d host-slots %d\n", p, peak, strings.Join(classes, " "),
		tr.H2D, tr.D2H, p.HostBytes()), nil
}

// fourLayers is a GPT-like spec: embedding, two blocks, head tied to the
// embedding.
func fourLayers(mb, group int, acts offload.ActPolicy) Spec {
	s := Spec{MicroBatches: mb, Group: group, Weights: offload.TierHost, Grads: offload.TierHost, Prefetch: 1, Train: true}
	for i := 0; i < 4; i++ {
		s.Layers = append(s.Layers, Layer{ParamBytes: 1000, ActBytes: 4000, OutBytes: 512})
		s.Acts = append(s.Acts, acts)
	}
	s.Layers[3].OutBytes = 0
	s.Layers[3].Tied = []int{0}
	return s
}

// TestLayerMajorTrafficFixedPerStep: with layer-major order and recompute,
// the weights cross once forward and once backward per step and the
// gradients leave once, whatever the accumulation; micro-batch-major
// traffic grows with it.
func TestLayerMajorTrafficFixedPerStep(t *testing.T) {
	var first Traffic
	for i, A := range []int{1, 3, 8} {
		p, err := Compile(fourLayers(A, A, offload.Recompute))
		if err != nil {
			t.Fatal(err)
		}
		tr := p.Traffic()
		if i == 0 {
			first = tr
			continue
		}
		if tr != first {
			t.Errorf("layer-major, %d micro-batches: traffic %+v, with 1: %+v", A, tr, first)
		}
		mbm, err := Compile(fourLayers(A, 1, offload.Recompute))
		if err != nil {
			t.Fatal(err)
		}
		if got := mbm.Traffic(); got.H2D <= tr.H2D || got.D2H <= tr.D2H {
			t.Errorf("micro-batch-major, %d micro-batches: traffic %+v, not above layer-major's %+v", A, got, tr)
		}
	}
}

// TestProgramInvariants checks, over many specs, what every executor
// relies on: each op's layer has its weights (and grads in backward) and
// activations bound; every interval is allocated before its first use and
// freed after its last; offloaded activations come back after they left.
func TestProgramInvariants(t *testing.T) {
	for _, A := range []int{1, 2, 5} {
		for _, G := range []int{1, 2, A} {
			for _, w := range []offload.Tier{offload.TierDevice, offload.TierHost} {
				for _, g := range []offload.Tier{offload.TierDevice, offload.TierHost} {
					for _, pol := range []offload.ActPolicy{offload.Keep, offload.Recompute, offload.OffloadTo, offload.RecomputeHost} {
						for _, pf := range []int{1, 3} {
							s := fourLayers(A, G, pol)
							s.Weights, s.Grads, s.Prefetch = w, g, pf
							name := fmt.Sprintf("A%d G%d w=%s g=%s %s prefetch %d", A, G, w, g, pol, pf)
							p, err := Compile(s)
							if err != nil {
								t.Fatalf("%s: %v", name, err)
							}
							checkInvariants(t, name, p)
						}
					}
				}
			}
		}
	}
}

// TestDeviceOptimizerInvariants: the same invariants with the optimizer
// state of a prefix of the layers on the device, and what that buys: no
// weights fetched and no gradients sent for those layers.
func TestDeviceOptimizerInvariants(t *testing.T) {
	for _, A := range []int{1, 3} {
		for _, G := range []int{1, A} {
			for _, k := range []int{1, 2, 4} {
				for _, pol := range []offload.ActPolicy{offload.Recompute, offload.OffloadTo, offload.RecomputeHost} {
					s := fourLayers(A, G, pol)
					for i := range s.Layers {
						s.Layers[i].MasterBytes, s.Layers[i].MomentBytes = 2*s.Layers[i].ParamBytes, 2*s.Layers[i].ParamBytes
						s.Optimizer = append(s.Optimizer, offload.TierHost)
						if i < k {
							s.Optimizer[i] = offload.TierDevice
						}
					}
					name := fmt.Sprintf("A%d G%d device optimizer for %d layers %s", A, G, k, pol)
					p, err := Compile(s)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					checkInvariants(t, name, p)
					var opt int
					for _, iv := range p.Intervals {
						dev := iv.Layer < k
						switch iv.Class {
						case Weights, Grads:
							if dev && (!iv.Persistent || iv.Fetch || iv.Evict) {
								t.Fatalf("%s: %s of a device-updated layer: %+v", name, iv.name(), iv)
							}
							if !dev && iv.Persistent {
								t.Fatalf("%s: streamed %s is persistent", name, iv.name())
							}
						case Master, MomentM, MomentV:
							if !dev || !iv.Persistent || iv.AllocAt != -1 {
								t.Fatalf("%s: %s: %+v", name, iv.name(), iv)
							}
							opt++
						}
					}
					if opt != 3*k {
						t.Fatalf("%s: %d optimizer intervals, want %d", name, opt, 3*k)
					}
				}
			}
		}
	}
}

// TestDeviceOptimizerPeakExact: with weights and gradients resident, each
// layer whose optimizer moves to the device adds exactly its master and
// moments (as the cache rounds them) to the peak, for training and
// evaluation alike; streamed, it also stops that layer's traffic.
func TestDeviceOptimizerPeakExact(t *testing.T) {
	for _, streamedWG := range []bool{false, true} {
		base := fourLayers(3, 3, offload.Recompute)
		if !streamedWG {
			base.Weights, base.Grads = offload.TierDevice, offload.TierDevice
		}
		for i := range base.Layers {
			base.Layers[i].MasterBytes, base.Layers[i].MomentBytes = 4000, 4000
		}
		p0, err := Compile(base)
		if err != nil {
			t.Fatal(err)
		}
		peak0, _ := p0.Peak()
		tr0 := p0.Traffic()
		var added int64
		for k := 1; k <= len(base.Layers); k++ {
			s := base
			s.Optimizer = make([]offload.Tier, len(s.Layers))
			for i := range s.Optimizer {
				s.Optimizer[i] = offload.TierHost
				if i < k {
					s.Optimizer[i] = offload.TierDevice
				}
			}
			added += 3 * RoundBlock(4000)
			p, err := Compile(s)
			if err != nil {
				t.Fatal(err)
			}
			peak, by := p.Peak()
			if !streamedWG && peak != peak0+added {
				t.Errorf("resident w/g, %d layers on the device: peak %d, want %d + %d", k, peak, peak0, added)
			}
			if by[offload.AdamM] != int64(k)*RoundBlock(4000) || by[offload.Master] != int64(k)*RoundBlock(4000) {
				t.Errorf("%d layers on the device: peak by class %v", k, by)
			}
			if tr := p.Traffic(); streamedWG && (tr.H2D >= tr0.H2D || tr.D2H >= tr0.D2H) {
				t.Errorf("streamed, %d layers updated on the device: traffic %+v, all on the host %+v", k, tr, tr0)
			}
			ev := s
			ev.Train, ev.MicroBatches, ev.Group, ev.Acts = false, 1, 1, nil
			pe, err := Compile(ev)
			if err != nil {
				t.Fatal(err)
			}
			if _, eby := pe.Peak(); eby[offload.AdamV] != int64(k)*RoundBlock(4000) {
				t.Errorf("eval, %d layers on the device: %v", k, eby)
			}
		}
	}
}

func checkInvariants(t *testing.T, name string, p *Program) {
	t.Helper()
	n := len(p.Spec.Layers)
	for j, op := range p.Ops {
		has := map[[3]int]bool{}
		for _, i := range p.Uses[j] {
			iv := &p.Intervals[i]
			if iv.AllocAt >= j || iv.Start > j || iv.End < j {
				t.Fatalf("%s: op %d %s uses %s [%d,%d] allocated at %d", name, j, op, iv.name(), iv.Start, iv.End, iv.AllocAt)
			}
			has[[3]int{int(iv.Class), iv.Layer, iv.MB}] = true
		}
		need := [][3]int{{int(Weights), op.Layer, -1}}
		if op.Kind == Backward {
			need = append(need, [3]int{int(Grads), op.Layer, -1})
			if op.Layer < n-1 {
				need = append(need, [3]int{int(DGrad), op.Layer, op.MB})
			}
			if op.Layer > 0 {
				need = append(need, [3]int{int(DGrad), op.Layer - 1, op.MB})
			}
		}
		need = append(need, [3]int{int(Acts), op.Layer, op.MB})
		for _, k := range need {
			if !has[k] {
				t.Fatalf("%s: op %d %s lacks %v", name, j, op, k)
			}
		}
		if op.Layer > 0 && !has[[3]int{int(Acts), op.Layer - 1, op.MB}] && !has[[3]int{int(Ckpt), op.Layer - 1, op.MB}] {
			t.Fatalf("%s: op %d %s has no input", name, j, op)
		}
	}
	for i, iv := range p.Intervals {
		if iv.Src >= 0 {
			src := p.Intervals[iv.Src]
			if iv.FetchAt < src.End || src.Slot != iv.Slot {
				t.Fatalf("%s: interval %d fetched at %d before its copy out after %d", name, i, iv.FetchAt, src.End)
			}
		}
	}
	if peak, _ := p.Peak(); peak <= 0 {
		t.Fatalf("%s: peak %d", name, peak)
	}
}

// TestPeakGrowsWithGroup: layer-major holds every micro-batch of the group
// at once, so its activation peak grows with the group.
func TestPeakGrowsWithGroup(t *testing.T) {
	var prev int64
	for _, G := range []int{1, 2, 4} {
		p, err := Compile(fourLayers(4, G, offload.Keep))
		if err != nil {
			t.Fatal(err)
		}
		_, by := p.Peak()
		if a := by[offload.Activations]; a <= prev {
			t.Errorf("group %d: activation peak %d, not above group %d's", G, a, prev)
		} else {
			prev = a
		}
	}
}

func TestCompileErrors(t *testing.T) {
	for _, s := range []Spec{
		{},
		{Layers: []Layer{{}}, MicroBatches: 0, Weights: offload.TierHost, Grads: offload.TierHost},
		{Layers: []Layer{{}}, MicroBatches: 1, Weights: offload.TierDisk, Grads: offload.TierHost},
		{Layers: []Layer{{Tied: []int{0}}}, MicroBatches: 1, Weights: offload.TierHost, Grads: offload.TierHost},
		{Layers: []Layer{{}, {}}, MicroBatches: 1, Weights: offload.TierHost, Grads: offload.TierHost, Acts: []offload.ActPolicy{offload.Keep}},
		{Layers: []Layer{{}, {}}, MicroBatches: 1, Weights: offload.TierHost, Grads: offload.TierHost, Optimizer: []offload.Tier{offload.TierDevice}},
		{Layers: []Layer{{}}, MicroBatches: 1, Weights: offload.TierHost, Grads: offload.TierHost, Optimizer: []offload.Tier{9}},
	} {
		if _, err := Compile(s); err == nil {
			t.Errorf("Compile(%+v): no error", s)
		}
	}
}

func BenchmarkCompile(b *testing.B) {
	// gpt2-1.3b's 26 layers, 64 micro-batches, recompute, layer-major.
	s := Spec{MicroBatches: 64, Group: 64, Weights: offload.TierHost, Grads: offload.TierHost, Train: true, Prefetch: 2}
	for i := 0; i < 26; i++ {
		s.Layers = append(s.Layers, Layer{ParamBytes: 100 << 20, ActBytes: 70 << 20, OutBytes: 4 << 20})
		s.Acts = append(s.Acts, offload.Recompute)
	}
	s.Layers[25].Tied = []int{0}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, _, err := PeakOf(s); err != nil {
			b.Fatal(err)
		}
	}
}

// residentSpec is fourLayers with everything on the device: the resident
// program's spec.
func residentSpec(mb int, shared bool) Spec {
	s := fourLayers(mb, 1, offload.Keep)
	s.Weights, s.Grads, s.Resident, s.SharedDGrad = offload.TierDevice, offload.TierDevice, true, shared
	s.Optimizer = []offload.Tier{offload.TierDevice, offload.TierDevice, offload.TierDevice, offload.TierDevice}
	for i := range s.Layers {
		s.Layers[i].MasterBytes, s.Layers[i].MomentBytes = 2000, 2000
	}
	return s
}

// TestResidentProgram: in the resident program every interval is
// persistent (nothing is allocated, moved or freed during a step), each
// layer's activations and the output gradients live in blocks every
// micro-batch reuses, and its peak is those blocks once, whatever the
// accumulation; consecutive backwards get distinct output-gradient
// blocks unless they are shared.
func TestResidentProgram(t *testing.T) {
	var want int64
	for _, shared := range []bool{false, true} {
		for _, A := range []int{1, 3, 8} {
			name := fmt.Sprintf("shared %v, %d micro-batches", shared, A)
			p, err := Compile(residentSpec(A, shared))
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, name, p)
			blocks := map[[2]int]int64{}
			for _, iv := range p.Intervals {
				if !iv.Persistent || iv.Fetch || iv.Evict || iv.AllocAt != -1 {
					t.Fatalf("%s: %s is not a persistent block that stays put", name, iv.name())
				}
				blocks[[2]int{int(iv.Class), iv.Block}] = RoundBlock(iv.Bytes)
			}
			var sum int64
			for _, b := range blocks {
				sum += b
			}
			peak, by := p.Peak()
			if peak != sum {
				t.Errorf("%s: peak %d, the blocks take %d", name, peak, sum)
			}
			if tr := p.Traffic(); tr != (Traffic{}) {
				t.Errorf("%s: traffic %+v", name, tr)
			}
			if a := by[offload.Activations]; a != 4*RoundBlock(4000) {
				t.Errorf("%s: activations %d, want one micro-batch's", name, a)
			}
			dgrad := 2
			if shared {
				dgrad = 1
			}
			if w := by[offload.Workspace]; w != int64(dgrad)*RoundBlock(512) {
				t.Errorf("%s: output gradients %d, want %d blocks", name, w, dgrad)
			}
			if A == 1 {
				want = peak
			} else if peak != want {
				t.Errorf("%s: peak %d, %d with one micro-batch", name, peak, want)
			}
			for j, op := range p.Ops {
				var in, out = -1, -1
				for _, i := range p.Uses[j] {
					if iv := &p.Intervals[i]; iv.Class == DGrad && op.Kind == Backward {
						if iv.Layer == op.Layer {
							out = iv.Block
						} else {
							in = iv.Block
						}
					}
				}
				if in >= 0 && out >= 0 && (in == out) != shared {
					t.Errorf("%s: %s reads output-gradient block %d and writes block %d", name, op, out, in)
				}
			}
		}
	}
	for _, s := range []Spec{
		func() Spec { s := residentSpec(2, false); s.Weights = offload.TierHost; return s }(),
		func() Spec { s := residentSpec(2, false); s.Optimizer[1] = offload.TierHost; return s }(),
		func() Spec { s := residentSpec(2, false); s.Acts[1] = offload.Recompute; return s }(),
		func() Spec { s := residentSpec(2, false); s.Group = 2; return s }(),
		func() Spec { s := fourLayers(2, 1, offload.Keep); s.SharedDGrad = true; return s }(),
	} {
		if _, err := Compile(s); err == nil {
			t.Errorf("Compile(%+v): no error", s)
		}
	}
}

// TestLastLayerTurnsAround: in every order, the last layer's activations
// (a language model's logits) are live for one micro-batch at a time, and
// its gradients still form one run per group (not one per micro-batch).
func TestLastLayerTurnsAround(t *testing.T) {
	for _, G := range []int{1, 2, 4} {
		s := fourLayers(4, G, offload.Recompute) // streamed weights and gradients
		p, err := Compile(s)
		if err != nil {
			t.Fatal(err)
		}
		last := len(s.Layers) - 1
		var acts, grads []Interval
		for _, iv := range p.Intervals {
			if iv.Layer != last {
				continue
			}
			switch iv.Class {
			case Acts:
				acts = append(acts, iv)
			case Grads:
				grads = append(grads, iv)
			}
		}
		for i := range acts {
			for j := range i {
				if acts[i].Start <= acts[j].End && acts[j].Start <= acts[i].End {
					t.Errorf("group %d: the last layer's activations of micro-batches %d [%d,%d] and %d [%d,%d] are live together",
						G, acts[j].MB, acts[j].Start, acts[j].End, acts[i].MB, acts[i].Start, acts[i].End)
				}
			}
		}
		if groups := (s.MicroBatches + G - 1) / G; len(grads) != groups {
			t.Errorf("group %d: the last layer's gradients in %d runs, want one per group (%d)", G, len(grads), groups)
		}
		for _, g := range grads {
			if op := p.Ops[g.Start]; op.Kind != Backward {
				t.Errorf("group %d: the last layer's gradients start at %s, not at a backward", G, op)
			}
		}
	}
}
