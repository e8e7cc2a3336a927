package stream

import (
	"fmt"
	"io"
	"sort"
	"time"
)

// Breakdown is where one step's wall time went. Each figure is the length
// of a union of spans, so overlapping spans of one kind count once.
type Breakdown struct {
	Step int
	Wall time.Duration // the step span
	// Compute is the time any compute queue was busy.
	Compute time.Duration
	// H2D, D2H and Disk are the time each kind of transfer was in flight;
	// Transfer is their union.
	H2D, D2H, Disk, Transfer time.Duration
	// ExposedTransfer is transfer time not overlapped by compute: what
	// transfers add to the step.
	ExposedTransfer time.Duration
	// Optimizer is the host optimizer's time; ExposedOptimizer the part
	// overlapped by neither compute nor transfers.
	Optimizer, ExposedOptimizer time.Duration
	// LoaderWait is the time the trainer waited for data.
	LoaderWait time.Duration
	// Idle is wall time covered by no span at all.
	Idle time.Duration
}

// interval is [a, b).
type interval struct{ a, b time.Duration }

// union merges intervals into a sorted, disjoint list.
func union(in []interval) []interval {
	s := append([]interval(nil), in...)
	sort.Slice(s, func(i, j int) bool { return s[i].a < s[j].a })
	var out []interval
	for _, iv := range s {
		if iv.b <= iv.a {
			continue
		}
		if n := len(out); n > 0 && iv.a <= out[n-1].b {
			out[n-1].b = max(out[n-1].b, iv.b)
			continue
		}
		out = append(out, iv)
	}
	return out
}

func length(u []interval) time.Duration {
	var d time.Duration
	for _, iv := range u {
		d += iv.b - iv.a
	}
	return d
}

// intersect returns the intersection of two sorted disjoint lists.
func intersect(x, y []interval) []interval {
	var out []interval
	for i, j := 0, 0; i < len(x) && j < len(y); {
		a, b := max(x[i].a, y[j].a), min(x[i].b, y[j].b)
		if a < b {
			out = append(out, interval{a, b})
		}
		if x[i].b < y[j].b {
			i++
		} else {
			j++
		}
	}
	return out
}

// minus returns the part of x not in y (both sorted, disjoint).
func minus(x, y []interval) time.Duration { return length(x) - length(intersect(x, y)) }

// clip restricts spans of the given categories to [w.a, w.b) and merges them.
func clip(spans []Span, w interval, cats ...Category) []interval {
	var ivs []interval
	for _, s := range spans {
		for _, c := range cats {
			if s.Cat == c {
				ivs = append(ivs, interval{max(s.Start, w.a), min(s.End, w.b)})
				break
			}
		}
	}
	return union(ivs)
}

// Breakdowns computes a Breakdown for every step span, from all spans that
// overlap it in time (whatever step they were tagged with: a prefetch
// issued during step n that runs into step n+1 counts where it ran).
func Breakdowns(spans []Span) []Breakdown {
	var out []Breakdown
	for _, st := range spans {
		if st.Cat != Step {
			continue
		}
		w := interval{st.Start, st.End}
		comp := clip(spans, w, Compute)
		xfer := clip(spans, w, H2D, D2H, Disk)
		opt := clip(spans, w, Optimizer)
		all := clip(spans, w, Compute, H2D, D2H, Disk, Optimizer, Loader)
		busy := union(append(append([]interval(nil), comp...), xfer...))
		out = append(out, Breakdown{
			Step:             st.Step,
			Wall:             w.b - w.a,
			Compute:          length(comp),
			H2D:              length(clip(spans, w, H2D)),
			D2H:              length(clip(spans, w, D2H)),
			Disk:             length(clip(spans, w, Disk)),
			Transfer:         length(xfer),
			ExposedTransfer:  minus(xfer, comp),
			Optimizer:        length(opt),
			ExposedOptimizer: minus(opt, busy),
			LoaderWait:       length(clip(spans, w, Loader)),
			Idle:             (w.b - w.a) - length(all),
		})
	}
	return out
}

// FormatBreakdowns writes the breakdowns as a table, one row per step, in
// milliseconds.
func FormatBreakdowns(w io.Writer, bs []Breakdown) error {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }
	if _, err := fmt.Fprintf(w, "%6s %10s %10s %10s %10s %10s %10s %10s %10s\n", "step", "wall_ms", "compute",
		"transfer", "exposed_x", "optimizer", "exposed_o", "loader", "idle"); err != nil {
		return err
	}
	for _, b := range bs {
		if _, err := fmt.Fprintf(w, "%6d %10s %10s %10s %10s %10s %10s %10s %10s\n", b.Step, ms(b.Wall), ms(b.Compute),
			ms(b.Transfer), ms(b.ExposedTransfer), ms(b.Optimizer), ms(b.ExposedOptimizer), ms(b.LoaderWait), ms(b.Idle)); err != nil {
			return err
		}
	}
	return nil
}
