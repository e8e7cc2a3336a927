package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	"github.com/spill-ml/spill/kernels"
	"github.com/spill-ml/spill/stream"
)

// Tracing (Config.Trace). Run creates a stream.Recorder and hands it to
// the trainer: the out-of-core trainer times every op of its three
// streams and its host optimizer itself (OffloadOptions.Recorder); the
// resident trainer times its uploads, forward and backward passes, loss
// read-backs, gradient statistics and AdamW updates as ops on its one
// queue (residentTrace). Run adds a span per step and a loader span around
// every batch the trainer waits for. With tracing off none of this runs:
// the trainer's trace is nil and the batch source is not wrapped.

// residentTrace is the resident trainer's tracing: four streams over the
// trainer's single queue, one per category, so that each op lands in the
// category the step breakdown needs. They share the queue's track in the
// trace (the ops run in queue order, one at a time).
type residentTrace struct {
	h2d, compute, d2h, opt *stream.Stream
}

// traceResident makes a resident trainer record its ops into rec. It does
// nothing for an out-of-core trainer (which takes its recorder in
// OffloadOptions) or a nil rec. Call it before the first step; Close
// stops the tracing after the ops enqueued so far have been stamped.
func (t *Trainer) traceResident(rec *stream.Recorder) {
	if rec == nil || t.off != nil || t.trace != nil {
		return
	}
	t.trace = &residentTrace{
		h2d:     stream.Wrap(t.be, t.q, stream.H2D, rec),
		compute: stream.Wrap(t.be, t.q, stream.Compute, rec),
		d2h:     stream.Wrap(t.be, t.q, stream.D2H, rec),
		opt:     stream.Wrap(t.be, t.q, stream.Optimizer, rec),
	}
}

// close stops the watchers after they have stamped every op.
func (rt *residentTrace) close() {
	for _, s := range []*stream.Stream{rt.h2d, rt.compute, rt.d2h, rt.opt} {
		s.Close()
	}
}

// tracedMicroBatch is accumulate's body for micro-batch k (staged in ring
// slot slot) when tracing: the same work, enqueued as traced ops.
func (t *Trainer) tracedMicroBatch(k, slot int, hb *HostBatch) error {
	rt := t.trace
	mb := strconv.Itoa(k)
	if err := rt.h2d.Enqueue("upload micro-batch "+mb, func(kernels.Queue) { t.upload(hb) }); err != nil {
		return err
	}
	ev, err := t.be.RecordEvent(t.q)
	if err != nil {
		return err
	}
	t.ringEv[slot] = ev
	if err := rt.compute.Enqueue("forward micro-batch "+mb, func(q kernels.Queue) { t.model.Forward(q, t.pass) }); err != nil {
		return err
	}
	nb := int(t.pass.Losses.Bytes())
	if err := rt.d2h.Enqueue("losses micro-batch "+mb, func(q kernels.Queue) {
		t.be.CopyToHost(q, t.stepHost[k*nb:(k+1)*nb], t.pass.Losses)
	}); err != nil {
		return err
	}
	return rt.compute.Enqueue("backward micro-batch "+mb, func(q kernels.Queue) { t.model.Backward(q, t.pass) })
}

// tracedSource is a BatchSource whose every Next is a loader span: the
// time the trainer waited for a batch.
type tracedSource struct {
	src BatchSource
	rec *stream.Recorder
}

func (s *tracedSource) Next(ctx context.Context, hb *HostBatch) error {
	defer s.rec.Begin("loader", stream.Loader, "next batch")()
	return s.src.Next(ctx, hb)
}

// StepTrace is where one step's time went, from the trace (Config.Trace):
// see stream.Breakdown for the definitions.
type StepTrace struct {
	Wall            time.Duration // the step, end to end
	Compute         time.Duration // device compute
	ExposedTransfer time.Duration // transfers not overlapped by compute
	Optimizer       time.Duration // the optimizer (host AdamW out of core, device AdamW resident)
	LoaderWait      time.Duration // waiting for the data loader
}

func stepTraceOf(b stream.Breakdown) StepTrace {
	return StepTrace{Wall: b.Wall, Compute: b.Compute, ExposedTransfer: b.ExposedTransfer, Optimizer: b.Optimizer, LoaderWait: b.LoaderWait}
}

// MeanStepTrace is the mean of the breakdowns, zero for none.
func MeanStepTrace(bs []stream.Breakdown) StepTrace {
	var m StepTrace
	if len(bs) == 0 {
		return m
	}
	for _, b := range bs {
		m.Wall += b.Wall
		m.Compute += b.Compute
		m.ExposedTransfer += b.ExposedTransfer
		m.Optimizer += b.Optimizer
		m.LoaderWait += b.LoaderWait
	}
	n := time.Duration(len(bs))
	return StepTrace{Wall: m.Wall / n, Compute: m.Compute / n, ExposedTransfer: m.ExposedTransfer / n,
		Optimizer: m.Optimizer / n, LoaderWait: m.LoaderWait / n}
}

// stepBreakdowns is stream.Breakdowns of every step span in spans (sorted
// by start, as Recorder.Spans returns them) for which keep returns true,
// each computed only from the spans that can overlap the step: linear in
// the spans per step instead of in the whole trace.
func stepBreakdowns(spans []stream.Span, keep func(step int) bool) []stream.Breakdown {
	var longest time.Duration
	for _, s := range spans {
		if s.Cat != stream.Step {
			longest = max(longest, s.End-s.Start)
		}
	}
	var out []stream.Breakdown
	var win []stream.Span
	for _, st := range spans {
		if st.Cat != stream.Step || !keep(st.Step) {
			continue
		}
		// Spans that overlap [st.Start, st.End) start after st.Start-longest.
		lo := sort.Search(len(spans), func(i int) bool { return spans[i].Start >= st.Start-longest })
		win = append(win[:0], st)
		for _, s := range spans[lo:] {
			if s.Start >= st.End {
				break
			}
			if s.Cat != stream.Step && s.End > st.Start {
				win = append(win, s)
			}
		}
		out = append(out, stream.Breakdowns(win)...)
	}
	return out
}

// lastStepTrace is the breakdown of step n from the spans recorded so
// far. Ops still in flight when it is called (an update the trainer did
// not wait for) are missing; the final breakdown (Summary.Breakdowns)
// has them.
func lastStepTrace(rec *stream.Recorder, n int) *StepTrace {
	bs := stepBreakdowns(rec.Spans(), func(step int) bool { return step == n })
	if len(bs) == 0 {
		return nil
	}
	st := stepTraceOf(bs[len(bs)-1])
	return &st
}

// writeTrace writes spans as Chrome trace JSON to path, atomically.
func writeTrace(path string, spans []stream.Span) error {
	err := WriteFileAtomic(path, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<20)
		if err := stream.WriteChrome(bw, spans); err != nil {
			return err
		}
		return bw.Flush()
	})
	if err != nil {
		return fmt.Errorf("engine: trace %s: %w", path, err)
	}
	return nil
}

// FormatStepTrace is a one-line summary of a step breakdown in
// milliseconds.
func FormatStepTrace(s StepTrace) string {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	return fmt.Sprintf("wall %.2f ms, compute %.2f ms, exposed transfer %.2f ms, optimizer %.2f ms, loader wait %.2f ms",
		ms(s.Wall), ms(s.Compute), ms(s.ExposedTransfer), ms(s.Optimizer), ms(s.LoaderWait))
}
