package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spill-ml/spill/kernels"
)

// Backend is the part of kernels.Backend that streams need.
type Backend interface {
	NewQueue(name string) (kernels.Queue, error)
	RecordEvent(q kernels.Queue) (kernels.Event, error)
	WaitEvent(q kernels.Queue, e kernels.Event) error
}

// Stream is a named queue of device work. Work enqueued on one stream runs
// in order; streams are ordered with each other only through events
// (Record on one, Wait on another). When the stream has a Recorder, every
// op enqueued with Enqueue is timed: it is bracketed by two events and a
// watcher goroutine stamps the moments the queue passes them.
//
// Enqueue, Record and Wait must not be called concurrently on one stream
// (one goroutine drives each stream); Synchronize may be called from any.
type Stream struct {
	be    Backend
	q     kernels.Queue
	name  string
	cat   Category
	rec   *Recorder
	watch chan timedOp
	done  chan struct{}
}

type timedOp struct {
	name       string
	queued     time.Duration
	begin, end kernels.Event
	step       int
}

// New creates a stream with a new queue of be, named name for traces,
// whose ops are of category cat. rec may be nil (no tracing).
func New(be Backend, name string, cat Category, rec *Recorder) (*Stream, error) {
	q, err := be.NewQueue(name)
	if err != nil {
		return nil, fmt.Errorf("stream: creating queue %q: %w", name, err)
	}
	return Wrap(be, q, cat, rec), nil
}

// Wrap makes a stream of an existing queue (the backend's default queue).
func Wrap(be Backend, q kernels.Queue, cat Category, rec *Recorder) *Stream {
	s := &Stream{be: be, q: q, name: q.Name(), cat: cat, rec: rec}
	if rec != nil {
		s.watch = make(chan timedOp, 4096)
		s.done = make(chan struct{})
		go s.watcher()
	}
	return s
}

// Name is the queue's name.
func (s *Stream) Name() string { return s.name }

// Queue is the underlying queue, for backend calls.
func (s *Stream) Queue() kernels.Queue { return s.q }

// Enqueue calls fn to enqueue work on the stream's queue (fn must only
// enqueue, on the queue it is given) and, when tracing, records the work
// as one span named op.
func (s *Stream) Enqueue(op string, fn func(q kernels.Queue)) error {
	if !s.rec.Active() {
		fn(s.q)
		return nil
	}
	queued := s.rec.Now()
	begin, err := s.be.RecordEvent(s.q)
	if err != nil {
		return fmt.Errorf("stream %s: %w", s.name, err)
	}
	fn(s.q)
	end, err := s.be.RecordEvent(s.q)
	if err != nil {
		return fmt.Errorf("stream %s: %w", s.name, err)
	}
	s.rec.mu.Lock()
	step := s.rec.mu.step
	s.rec.mu.Unlock()
	s.watch <- timedOp{name: op, queued: queued, begin: begin, end: end, step: step}
	return nil
}

// PassedAter is an optional upgrade of kernels.Event: a backend whose
// events know when their queue passed them (the CPU backend's do) lets the
// watcher time ops exactly instead of by when it observed them.
type PassedAter interface {
	PassedAt() (time.Time, bool)
}

// watcher stamps traced ops in queue order. With events that implement
// PassedAter (and a recorder on the wall clock) an op runs from its begin
// event to its end event. Otherwise an op starts when the queue passes its
// begin event; if the watcher finds it already passed (it was busy), the
// op started when it was enqueued or when the previous op ended, whichever
// is later.
func (s *Stream) watcher() {
	defer close(s.done)
	ctx := context.Background()
	var prevEnd time.Duration
	for op := range s.watch {
		var start, end time.Duration
		var beginErr, endErr error
		if op.begin.Done() {
			start = max(op.queued, prevEnd)
		} else {
			beginErr = op.begin.Synchronize(ctx)
			start = s.rec.Now()
		}
		endErr = op.end.Synchronize(ctx)
		end = max(s.rec.Now(), start)
		if t0, ok := s.rec.eventTime(op.begin); ok {
			if t1, ok := s.rec.eventTime(op.end); ok {
				start, end = t0, max(t1, t0)
			}
		}
		if beginErr != nil || endErr != nil {
			op.name += " (failed)"
		}
		prevEnd = end
		s.rec.mu.Lock()
		s.rec.mu.spans = append(s.rec.mu.spans, Span{Track: s.name, Cat: s.cat, Name: op.name, Start: start, End: end, Step: op.step})
		s.rec.mu.Unlock()
	}
}

// Record marks the current end of the stream.
func (s *Stream) Record() (kernels.Event, error) { return s.be.RecordEvent(s.q) }

// Wait makes work enqueued on s after this call wait for e.
func (s *Stream) Wait(e kernels.Event) error { return s.be.WaitEvent(s.q, e) }

// WaitFor makes work enqueued on s after this call wait for all work
// enqueued on other so far.
func (s *Stream) WaitFor(other *Stream) error {
	e, err := other.Record()
	if err != nil {
		return err
	}
	return s.Wait(e)
}

// Synchronize waits for all work enqueued on the stream so far and returns
// its first error (kernels.Queue.Synchronize).
func (s *Stream) Synchronize(ctx context.Context) error { return s.q.Synchronize(ctx) }

// Close stops tracing after the ops enqueued so far have been stamped
// (it waits for them). The queue itself belongs to the backend.
func (s *Stream) Close() {
	if s.watch != nil {
		close(s.watch)
		<-s.done
		s.watch = nil
	}
}

// Set is the engine's three streams: compute, host-to-device and
// device-to-host copies.
type Set struct {
	Compute, H2D, D2H *Stream
}

// NewSet creates the three streams on new queues named "compute", "h2d"
// and "d2h".
func NewSet(be Backend, rec *Recorder) (*Set, error) {
	var s Set
	var err error
	if s.Compute, err = New(be, "compute", Compute, rec); err != nil {
		return nil, err
	}
	if s.H2D, err = New(be, "h2d", H2D, rec); err != nil {
		s.Compute.Close()
		return nil, err
	}
	if s.D2H, err = New(be, "d2h", D2H, rec); err != nil {
		s.Compute.Close()
		s.H2D.Close()
		return nil, err
	}
	return &s, nil
}

// All is the streams in a fixed order.
func (s *Set) All() []*Stream { return []*Stream{s.Compute, s.H2D, s.D2H} }

// Synchronize waits for every stream and joins their errors.
func (s *Set) Synchronize(ctx context.Context) error {
	var errs []error
	for _, st := range s.All() {
		if err := st.Synchronize(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stream %s: %w", st.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// Close stops tracing on every stream.
func (s *Set) Close() {
	for _, st := range s.All() {
		st.Close()
	}
}
