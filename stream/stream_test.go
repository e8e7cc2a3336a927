package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/spill-ml/spill/kernels"
)

// fakeBackend runs each queue's work on a goroutine, like the CPU backend.
type fakeBackend struct{}

type fakeQueue struct {
	name string
	work chan func()
	mu   sync.Mutex
	err  error
}

func (q *fakeQueue) Name() string { return q.name }
func (q *fakeQueue) Synchronize(ctx context.Context) error {
	done := make(chan struct{})
	q.work <- func() { close(done) }
	select {
	case <-done:
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

type fakeEvent struct{ c chan struct{} }

func (e *fakeEvent) Synchronize(ctx context.Context) error {
	select {
	case <-e.c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (e *fakeEvent) Done() bool {
	select {
	case <-e.c:
		return true
	default:
		return false
	}
}

func (fakeBackend) NewQueue(name string) (kernels.Queue, error) {
	q := &fakeQueue{name: name, work: make(chan func(), 64)}
	go func() {
		for f := range q.work {
			f()
		}
	}()
	return q, nil
}

func (fakeBackend) RecordEvent(q kernels.Queue) (kernels.Event, error) {
	e := &fakeEvent{c: make(chan struct{})}
	q.(*fakeQueue).work <- func() { close(e.c) }
	return e, nil
}

func (fakeBackend) WaitEvent(q kernels.Queue, e kernels.Event) error {
	q.(*fakeQueue).work <- func() { <-e.(*fakeEvent).c }
	return nil
}

func sleepOn(d time.Duration) func(q kernels.Queue) {
	return func(q kernels.Queue) { q.(*fakeQueue).work <- func() { time.Sleep(d) } }
}

func TestStreamsTraceAndOrder(t *testing.T) {
	rec := NewRecorder()
	set, err := NewSet(fakeBackend{}, rec)
	if err != nil {
		t.Fatal(err)
	}
	endStep := rec.BeginStep(1)
	if err := set.Compute.Enqueue("matmul", sleepOn(20*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// The copy must wait for the compute stream.
	if err := set.D2H.WaitFor(set.Compute); err != nil {
		t.Fatal(err)
	}
	if err := set.D2H.Enqueue("grads to host", sleepOn(5*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := set.H2D.Enqueue("prefetch", sleepOn(5*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	func() { defer rec.Begin("host", Optimizer, "adamw")(); time.Sleep(time.Millisecond) }()
	if err := set.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	endStep()
	set.Close()

	byName := map[string]Span{}
	for _, s := range rec.Spans() {
		byName[s.Name] = s
		if s.End < s.Start || s.Step != 1 {
			t.Errorf("span %+v: bad times or step", s)
		}
	}
	mm, d2h, h2d := byName["matmul"], byName["grads to host"], byName["prefetch"]
	if mm.Track != "compute" || mm.Cat != Compute || mm.End-mm.Start < 20*time.Millisecond {
		t.Fatalf("matmul span %+v", mm)
	}
	if d2h.Start < mm.Start+20*time.Millisecond {
		t.Fatalf("d2h started at %v before compute (started %v) finished", d2h.Start, mm.Start)
	}
	if h2d.Start >= mm.End {
		t.Fatalf("unordered h2d did not overlap compute: %v vs %v", h2d, mm)
	}
	if _, ok := byName["adamw"]; !ok || len(byName) != 5 {
		t.Fatalf("spans %v", byName)
	}
	bs := Breakdowns(rec.Spans())
	if len(bs) != 1 || bs[0].Compute < 20*time.Millisecond || bs[0].ExposedTransfer < 5*time.Millisecond {
		t.Fatalf("breakdown %+v", bs)
	}
}

func TestUntracedStream(t *testing.T) {
	s, err := New(fakeBackend{}, "compute", Compute, nil)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	s.Enqueue("x", func(q kernels.Queue) { q.(*fakeQueue).work <- func() { ran = true } })
	if err := s.Synchronize(context.Background()); err != nil || !ran {
		t.Fatalf("untraced op: ran %v, %v", ran, err)
	}
	s.Close()
	var nilRec *Recorder
	nilRec.Begin("x", Loader, "y")()
	nilRec.BeginStep(3)()
	if nilRec.Spans() != nil {
		t.Fatal("nil recorder recorded")
	}
}

func TestChromeTraceJSON(t *testing.T) {
	ms := time.Millisecond
	spans := []Span{
		{Track: "compute", Cat: Compute, Name: "fwd", Start: 1 * ms, End: 3 * ms, Step: 0},
		{Track: "h2d", Cat: H2D, Name: "w1", Start: 0, End: 1500 * time.Microsecond, Step: 0},
		{Track: "steps", Cat: Step, Name: "step 0", Start: 0, End: 4 * ms, Step: 0},
		{Track: "loader", Cat: Loader, Name: "wait", Start: 5 * ms, End: 6 * ms, Step: -1},
	}
	var buf bytes.Buffer
	if err := WriteChrome(&buf, spans); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("invalid JSON: %v\n%s", err, buf.String())
	}
	threads := map[float64]string{}
	var xs []map[string]any
	for _, e := range doc.TraceEvents {
		switch e["ph"] {
		case "M":
			if e["name"] == "thread_name" {
				threads[e["tid"].(float64)] = e["args"].(map[string]any)["name"].(string)
			}
		case "X":
			xs = append(xs, e)
		default:
			t.Fatalf("unexpected phase in %v", e)
		}
	}
	if len(xs) != 4 || len(threads) != 4 {
		t.Fatalf("%d complete events, %d threads", len(xs), len(threads))
	}
	for i, e := range xs {
		s := spans[i]
		if threads[e["tid"].(float64)] != s.Track || e["name"] != s.Name || e["cat"] != string(s.Cat) {
			t.Errorf("event %v does not match span %+v", e, s)
		}
		if e["ts"].(float64) != float64(s.Start.Microseconds()) || e["dur"].(float64) != float64((s.End-s.Start).Microseconds()) {
			t.Errorf("event %v: times in µs do not match %+v", e, s)
		}
		if _, has := e["args"]; has != (s.Step >= 0) {
			t.Errorf("event %v: step arg", e)
		}
	}
}

func TestBreakdownArithmetic(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	sp := func(cat Category, track string, a, b int) Span {
		return Span{Track: track, Cat: cat, Start: ms(a), End: ms(b)}
	}
	spans := []Span{
		{Track: "steps", Cat: Step, Step: 7, Start: ms(0), End: ms(100)},
		// compute busy [10,40) and [50,80): 60 ms; the two compute spans overlap.
		sp(Compute, "compute", 10, 30), sp(Compute, "compute2", 20, 40), sp(Compute, "compute", 50, 80),
		// h2d [0,15) and d2h [35,60): union 40 ms, of which [10,15), [35,40), [50,60) overlap compute.
		sp(H2D, "h2d", 0, 15), sp(D2H, "d2h", 35, 60),
		// optimizer [75,95): [75,80) under compute, the rest exposed.
		sp(Optimizer, "host", 75, 95),
		// loader wait [95,98), and a span running past the step end is clipped.
		sp(Loader, "loader", 95, 98), sp(H2D, "h2d", 99, 130),
		// a span of another step entirely is ignored.
		sp(Compute, "compute", 200, 300),
	}
	bs := Breakdowns(spans)
	if len(bs) != 1 {
		t.Fatalf("%d breakdowns", len(bs))
	}
	want := Breakdown{Step: 7, Wall: ms(100), Compute: ms(60), H2D: ms(16), D2H: ms(25), Transfer: ms(41),
		ExposedTransfer: ms(21), Optimizer: ms(20), ExposedOptimizer: ms(15), LoaderWait: ms(3), Idle: ms(1)}
	if bs[0] != want {
		t.Fatalf("breakdown\n got %+v\nwant %+v", bs[0], want)
	}
	var out bytes.Buffer
	if err := FormatBreakdowns(&out, bs); err != nil || !bytes.Contains(out.Bytes(), []byte("21.00")) {
		t.Fatalf("table %q %v", out.String(), err)
	}
}

func TestIntervalHelpers(t *testing.T) {
	u := union([]interval{{5, 7}, {1, 3}, {2, 4}, {7, 8}, {9, 9}})
	if len(u) != 2 || u[0] != (interval{1, 4}) || u[1] != (interval{5, 8}) {
		t.Fatalf("union %v", u)
	}
	x := intersect(u, []interval{{0, 2}, {3, 6}, {7, 100}})
	if length(x) != 1+1+1+1 {
		t.Fatalf("intersect %v", x)
	}
	if minus(u, nil) != 6 || minus(u, u) != 0 {
		t.Fatal("minus")
	}
}

// stampBackend's events know when their queue passed them (PassedAter).
type stampBackend struct {
	fakeBackend
	mu  sync.Mutex
	evs []*stampEvent
}

type stampEvent struct {
	fakeEvent
	at time.Time
}

func (e *stampEvent) PassedAt() (time.Time, bool) {
	if !e.Done() {
		return time.Time{}, false
	}
	return e.at, true
}

func (b *stampBackend) RecordEvent(q kernels.Queue) (kernels.Event, error) {
	e := &stampEvent{fakeEvent: fakeEvent{c: make(chan struct{})}}
	b.mu.Lock()
	b.evs = append(b.evs, e)
	b.mu.Unlock()
	q.(*fakeQueue).work <- func() { e.at = time.Now(); close(e.c) }
	return e, nil
}

// TestStreamEventTimes: with events that know when they were passed, a
// span runs exactly from its begin event to its end event, however late
// the watcher looks at them.
func TestStreamEventTimes(t *testing.T) {
	be := &stampBackend{}
	rec := NewRecorder()
	s, err := New(be, "h2d", H2D, rec)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Enqueue("copy", sleepOn(5*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond) // both ops are done before the watcher is asked
	s.Close()
	spans := rec.Spans()
	if len(spans) != 2 || len(be.evs) != 4 {
		t.Fatalf("%d spans from %d events, want 2 from 4", len(spans), len(be.evs))
	}
	for i, sp := range spans {
		b, e := be.evs[2*i].at.Sub(rec.t0), be.evs[2*i+1].at.Sub(rec.t0)
		if sp.Start != b || sp.End != e {
			t.Errorf("span %d: [%v, %v], events passed at [%v, %v]", i, sp.Start, sp.End, b, e)
		}
		if sp.End-sp.Start < 5*time.Millisecond {
			t.Errorf("span %d lasted %v, the op sleeps 5ms", i, sp.End-sp.Start)
		}
	}
}
