package cpu

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// queue runs enqueued work in FIFO order on its own goroutine. The first
// error (or recovered panic) of any work item is sticky: later work items
// are skipped, and every Synchronize returns it. Markers (events,
// synchronisation points) always run, so waiters never hang.
type queue struct {
	b    *Backend
	name string

	mu struct {
		sync.Mutex
		items  []item
		closed bool
		err    error // sticky
	}
	wake chan struct{} // capacity 1: "items were added"
	done chan struct{} // closed when the goroutine exits
}

type item struct {
	name   string
	fn     func() error
	marker bool // runs even after a sticky error
	stop   bool
}

func newQueue(b *Backend, name string) *queue {
	q := &queue{b: b, name: name, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go q.loop()
	return q
}

func (q *queue) Name() string { return q.name }

func (q *queue) String() string { return "queue " + q.name }

// enqueue adds an op. It never blocks on the queue's progress.
func (q *queue) enqueue(name string, fn func() error) { q.push(item{name: name, fn: fn}) }

func (q *queue) marker(fn func() error) { q.push(item{name: "marker", fn: fn, marker: true}) }

func (q *queue) push(it item) {
	q.mu.Lock()
	if q.mu.closed {
		q.mu.Unlock()
		panic(fmt.Sprintf("kernels/cpu: %s enqueued on closed queue %s", it.name, q.name))
	}
	q.mu.items = append(q.mu.items, it)
	q.mu.closed = it.stop
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue) loop() {
	defer close(q.done)
	var batch []item
	for {
		q.mu.Lock()
		batch, q.mu.items = q.mu.items, batch[:0]
		q.mu.Unlock()
		if len(batch) == 0 {
			<-q.wake
			continue
		}
		for i := range batch {
			it := batch[i]
			batch[i] = item{}
			if it.stop {
				return
			}
			if !it.marker && q.err() != nil {
				continue
			}
			if err := runItem(it); err != nil {
				q.setErr(fmt.Errorf("kernels/cpu: queue %s: %s: %w", q.name, it.name, err))
			}
		}
	}
}

func runItem(it item) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return it.fn()
}

func (q *queue) err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.mu.err
}

func (q *queue) setErr(err error) {
	q.mu.Lock()
	if q.mu.err == nil {
		q.mu.err = err
	}
	q.mu.Unlock()
}

// Synchronize implements kernels.Queue.
func (q *queue) Synchronize(ctx context.Context) error {
	ev := q.record()
	return ev.Synchronize(ctx)
}

func (q *queue) record() *event {
	ev := &event{q: q, done: make(chan struct{})}
	q.marker(func() error {
		ev.err = q.err()
		ev.at = time.Now()
		close(ev.done)
		return nil
	})
	return ev
}

// wait makes later work on q wait for ev; an error sticky on ev's queue
// when ev was passed becomes sticky on q too.
func (q *queue) wait(ev *event) {
	q.marker(func() error {
		<-ev.done
		if ev.err != nil {
			return fmt.Errorf("waiting on an event of queue %s: %w", ev.q.name, ev.err)
		}
		return nil
	})
}

// close runs everything enqueued so far, stops the goroutine and returns
// the sticky error.
func (q *queue) close() error {
	q.push(item{name: "close", stop: true})
	<-q.done
	return q.err()
}

// event implements kernels.Event.
type event struct {
	q    *queue
	done chan struct{}
	err  error     // written before done is closed
	at   time.Time // when the queue passed the event; written before done is closed
}

// PassedAt is when the queue passed the event, and false if it has not
// yet. Tracers use it to time ops exactly (as CUDA event timing does).
func (e *event) PassedAt() (time.Time, bool) {
	if !e.Done() {
		return time.Time{}, false
	}
	return e.at, true
}

func (e *event) Synchronize(ctx context.Context) error {
	select {
	case <-e.done:
		return e.err
	case <-ctx.Done():
		select {
		case <-e.done:
			return e.err
		default:
		}
		return ctx.Err()
	}
}

func (e *event) Done() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}
