package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/term"

	"github.com/spill-ml/spill/engine"

	"github.com/spill-ml/spill/kernels"
)

// progressUnit says how a progress counter is printed.
type progressUnit int

const (
	unitBytes progressUnit = iota // 1.5 GiB, 310.2 MiB/s
	unitCount                     // 1234, 56.7/s
)

// progress draws a one-line status (done/total, percentage, rate, ETA) on a terminal,
// redrawn by a ticker. The work advances atomic counters (Add, Set, SetTotal) or
// supplies a function read by the ticker (Track); the ticker only reads them, so the
// hot path costs one atomic add. When the output is not a terminal, or quiet was
// asked for, nothing is drawn; the counters still work.
//
// Start begins drawing; Stop must be called once to end the ticker and finish the line.
type progress struct {
	out      io.Writer
	label    string
	unit     progressUnit
	interval time.Duration
	draw     bool

	done  atomic.Int64
	total atomic.Int64 // 0 = unknown
	track atomic.Pointer[func() int64]

	start    time.Time
	stop     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once

	// Owned by the ticker goroutine.
	lastAt   time.Time
	lastDone int64
	rate     float64 // smoothed units per second
	drawn    bool    // something is on the line
}

// newProgress returns a progress line for out. It draws only when out is a terminal
// and quiet is false.
func newProgress(out io.Writer, label string, unit progressUnit, quiet bool) *progress {
	return &progress{out: out, label: label, unit: unit, interval: 200 * time.Millisecond,
		draw: !quiet && isTerminal(out), stop: make(chan struct{})}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Add advances the counter by n.
func (p *progress) Add(n int64) { p.done.Add(n) }

// Set sets the counter to n.
func (p *progress) Set(n int64) { p.done.Store(n) }

// SetTotal sets the expected final value of the counter (0 = unknown).
func (p *progress) SetTotal(n int64) { p.total.Store(n) }

// Track makes the ticker read the counter from f (which must be safe to call from
// another goroutine, typically an atomic load) instead of the internal counter.
func (p *progress) Track(f func() int64) { p.track.Store(&f) }

// Value returns the current counter.
func (p *progress) Value() int64 {
	if f := p.track.Load(); f != nil {
		return (*f)()
	}
	return p.done.Load()
}

// Start begins drawing, if drawing is enabled.
func (p *progress) Start() {
	p.start = time.Now()
	p.lastAt = p.start
	if !p.draw {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(p.interval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case now := <-t.C:
				p.redraw(now)
			}
		}
	}()
}

// Stop ends the ticker. If anything was drawn, the line is redrawn a last time and
// ended with a newline. Safe to call more than once.
func (p *progress) Stop() {
	p.stopOnce.Do(func() {
		close(p.stop)
		p.wg.Wait()
		if p.drawn {
			p.redraw(time.Now())
			fmt.Fprintln(p.out)
		}
	})
}

// Elapsed is the time since Start.
func (p *progress) Elapsed() time.Duration { return time.Since(p.start) }

func (p *progress) redraw(now time.Time) {
	done := p.Value()
	if dt := now.Sub(p.lastAt).Seconds(); dt > 0 {
		inst := float64(done-p.lastDone) / dt
		if p.lastDone == 0 && p.rate == 0 {
			p.rate = inst
		} else {
			p.rate = 0.7*p.rate + 0.3*inst
		}
		p.lastAt, p.lastDone = now, done
	}
	fmt.Fprintf(p.out, "\r\x1b[K%s", p.line(done, p.total.Load(), p.rate))
	p.drawn = true
}

// line renders the status for done of total (0 = unknown) at rate units per second.
func (p *progress) line(done, total int64, rate float64) string {
	var b strings.Builder
	b.WriteString(p.label)
	if total > 0 {
		frac := min(float64(done)/float64(total), 1)
		const width = 24
		fill := int(frac * width)
		fmt.Fprintf(&b, " [%s%s] %5.1f%% %s/%s", strings.Repeat("=", fill), strings.Repeat(" ", width-fill),
			100*frac, p.amount(done), p.amount(total))
	} else {
		fmt.Fprintf(&b, " %s", p.amount(done))
	}
	if rate > 0 {
		fmt.Fprintf(&b, " %s/s", p.amount(int64(rate)))
		if total > done {
			eta := time.Duration(float64(total-done) / rate * float64(time.Second))
			fmt.Fprintf(&b, " ETA %s", engine.FormatDuration(eta))
		}
	}
	return b.String()
}

func (p *progress) amount(n int64) string {
	if p.unit == unitBytes {
		return formatBytes(n)
	}
	return fmt.Sprint(n)
}

// formatBytes prints n with a binary unit ("64.0 MiB"; kernels.FormatBytes).
func formatBytes(n int64) string { return kernels.FormatBytes(n) }
