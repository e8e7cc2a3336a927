package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/spill-ml/spill/stream"
)

// Tracing (Config.Trace). Run creates a stream.Recorder and hands it to
// the trainer (OffloadOptions.Recorder), which times every op of its
// three streams, its uploads, loss read-backs and device AdamW (as ops of
// the compute queue under those categories) and its host optimizer. Run
// adds a span per step and a loader span around every batch the trainer
// waits for. With tracing off none of this runs: the streams have no
// recorder and the batch source is not wrapped.

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
	Wall             time.Duration // the step, end to end
	Compute          time.Duration // device compute
	ExposedTransfer  time.Duration // transfers not overlapped by compute
	Optimizer        time.Duration // the optimizer (host AdamW out of core, device AdamW resident)
	ExposedOptimizer time.Duration // the host optimizer while the device neither computes nor copies
	LoaderWait       time.Duration // waiting for the data loader
}

func stepTraceOf(b stream.Breakdown) StepTrace {
	return StepTrace{Wall: b.Wall, Compute: b.Compute, ExposedTransfer: b.ExposedTransfer, Optimizer: b.Optimizer, ExposedOptimizer: b.ExposedOptimizer, LoaderWait: b.LoaderWait}
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
		m.ExposedOptimizer += b.ExposedOptimizer
		m.LoaderWait += b.LoaderWait
	}
	n := time.Duration(len(bs))
	return StepTrace{Wall: m.Wall / n, Compute: m.Compute / n, ExposedTransfer: m.ExposedTransfer / n,
		Optimizer: m.Optimizer / n, ExposedOptimizer: m.ExposedOptimizer / n, LoaderWait: m.LoaderWait / n}
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
	return fmt.Sprintf("wall %.2f ms, compute %.2f ms, exposed transfer %.2f ms, optimizer %.2f ms (%.2f ms exposed), loader wait %.2f ms",
		ms(s.Wall), ms(s.Compute), ms(s.ExposedTransfer), ms(s.Optimizer), ms(s.ExposedOptimizer), ms(s.LoaderWait))
}
