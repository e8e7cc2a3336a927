// Package stream gives the engine named queues of device work (compute,
// h2d, d2h) over kernels.Queue and kernels.Event, and a trace recorder that
// times every op of every queue and every host-side span (the host
// optimizer, the data loader), exports them as Chrome trace JSON (which
// Perfetto opens) and breaks each step down into compute, exposed transfer,
// optimizer and loader-wait time.
package stream

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Category classifies a span for the step breakdown.
type Category string

// Categories of spans.
const (
	Compute   Category = "compute"   // device compute
	H2D       Category = "h2d"       // host-to-device transfer
	D2H       Category = "d2h"       // device-to-host transfer
	Disk      Category = "disk"      // disk reads and writes
	Optimizer Category = "optimizer" // the host optimizer
	Comm      Category = "comm"      // collectives between data-parallel ranks
	Loader    Category = "loader"    // the trainer waiting for the data loader
	Step      Category = "step"      // one training step, end to end
)

// Span is one timed interval on one track (a queue or a host thread).
// Times are offsets from the Recorder's start.
type Span struct {
	Track      string
	Cat        Category
	Name       string
	Start, End time.Duration
	Step       int // the step the span belongs to, -1 if none
}

// eventTime is when e's queue passed it, on the recorder's time line, if
// the backend says (PassedAter) and the recorder runs on the wall clock.
func (r *Recorder) eventTime(e any) (time.Duration, bool) {
	pa, ok := e.(PassedAter)
	if !ok || !r.wall {
		return 0, false
	}
	t, ok := pa.PassedAt()
	if !ok {
		return 0, false
	}
	return t.Sub(r.t0), true
}

// Recorder collects spans. The zero value is not usable; a nil *Recorder
// records nothing, so callers need not check whether tracing is on. All
// methods are safe for concurrent use.
type Recorder struct {
	t0   time.Time
	now  func() time.Time
	wall bool // now is time.Now
	// off pauses the recording of new ops and host spans (SetActive).
	off atomic.Bool
	mu  struct {
		sync.Mutex
		spans []Span
		step  int
	}
}

// NewRecorder returns a recorder whose time zero is now.
func NewRecorder() *Recorder {
	r := &Recorder{t0: time.Now(), now: time.Now, wall: true}
	r.mu.step = -1
	return r
}

// SetActive starts (true, the default) or pauses the timing of new ops
// and host spans: while paused, streams enqueue their work untimed and
// Begin records nothing, at no cost beyond one atomic load per op. Steps
// are still opened and closed. A run that samples a few steps' breakdowns
// (the exposed transfer time) turns it on for those steps only.
func (r *Recorder) SetActive(on bool) {
	if r != nil {
		r.off.Store(!on)
	}
}

// Active reports whether r times new ops (false for a nil r).
func (r *Recorder) Active() bool { return r != nil && !r.off.Load() }

// DropThrough forgets the spans of steps up to and including step n (and
// those of no step): what a run that keeps no trace file does once it has
// taken their breakdowns, so that the recorder does not grow.
func (r *Recorder) DropThrough(n int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	keep := r.mu.spans[:0]
	for _, s := range r.mu.spans {
		if s.Step > n {
			keep = append(keep, s)
		}
	}
	clear(r.mu.spans[len(keep):])
	r.mu.spans = keep
	r.mu.Unlock()
}

// Now is the time since the recorder's start.
func (r *Recorder) Now() time.Duration { return r.now().Sub(r.t0) }

// Add records a span. Its Step is set to the step open when Add is called
// (-1 if none).
func (r *Recorder) Add(s Span) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s.Step = r.mu.step
	r.mu.spans = append(r.mu.spans, s)
}

// Begin starts a host span on track and returns the function that ends it:
//
//	defer rec.Begin("optimizer", stream.Optimizer, "adamw layer 3")()
func (r *Recorder) Begin(track string, cat Category, name string) (end func()) {
	if !r.Active() {
		return func() {}
	}
	start := r.Now()
	return func() { r.Add(Span{Track: track, Cat: cat, Name: name, Start: start, End: r.Now()}) }
}

// BeginStep opens step n: spans added until its end belong to it. The
// returned function ends the step and records its span.
func (r *Recorder) BeginStep(n int) (end func()) {
	if r == nil {
		return func() {}
	}
	start := r.Now()
	r.mu.Lock()
	r.mu.step = n
	r.mu.Unlock()
	return func() {
		s := Span{Track: "steps", Cat: Step, Name: fmt.Sprintf("step %d", n), Start: start, End: r.Now(), Step: n}
		r.mu.Lock()
		r.mu.spans = append(r.mu.spans, s)
		r.mu.step = -1
		r.mu.Unlock()
	}
}

// Spans returns a copy of the spans, sorted by start time.
func (r *Recorder) Spans() []Span {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	out := append([]Span(nil), r.mu.spans...)
	r.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

type chromeEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  float64        `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// WriteChrome writes the spans in the Chrome trace event format (JSON
// object form), one thread per track, timestamps in microseconds.
func WriteChrome(w io.Writer, spans []Span) error {
	tids := map[string]int{}
	var tracks []string
	for _, s := range spans {
		if _, ok := tids[s.Track]; !ok {
			tids[s.Track] = len(tids) + 1
			tracks = append(tracks, s.Track)
		}
	}
	events := make([]chromeEvent, 0, len(spans)+len(tracks)+1)
	events = append(events, chromeEvent{Name: "process_name", Ph: "M", Pid: 1, Args: map[string]any{"name": "spill"}})
	for _, t := range tracks {
		events = append(events, chromeEvent{Name: "thread_name", Ph: "M", Pid: 1, Tid: tids[t], Args: map[string]any{"name": t}})
	}
	for _, s := range spans {
		ev := chromeEvent{Name: s.Name, Cat: string(s.Cat), Ph: "X", Pid: 1, Tid: tids[s.Track],
			Ts: float64(s.Start) / 1e3, Dur: float64(s.End-s.Start) / 1e3}
		if s.Step >= 0 {
			ev.Args = map[string]any{"step": s.Step}
		}
		events = append(events, ev)
	}
	enc := json.NewEncoder(w)
	return enc.Encode(struct {
		TraceEvents     []chromeEvent `json:"traceEvents"`
		DisplayTimeUnit string        `json:"displayTimeUnit"`
	}{events, "ms"})
}

// WriteChrome writes the recorder's spans (see the function WriteChrome).
func (r *Recorder) WriteChrome(w io.Writer) error { return WriteChrome(w, r.Spans()) }
