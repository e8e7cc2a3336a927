package engine

import "math"

// LRSchedule is linear warmup from 0 to Peak over Warmup steps, then cosine
// decay to Min at step Steps (nanoGPT's get_lr, 0-based steps).
type LRSchedule struct {
	Peak, Min     float64
	Warmup, Steps int
}

// At is the learning rate of 0-based step s.
func (l LRSchedule) At(s int) float64 {
	if s < l.Warmup {
		return l.Peak * float64(s+1) / float64(l.Warmup)
	}
	if s >= l.Steps || l.Steps <= l.Warmup {
		return l.Min
	}
	ratio := float64(s-l.Warmup) / float64(l.Steps-l.Warmup)
	coef := 0.5 * (1 + math.Cos(math.Pi*ratio))
	return l.Min + coef*(l.Peak-l.Min)
}
