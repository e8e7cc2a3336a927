// Package launch starts the ranks of a data-parallel job on this host the
// way torchrun does: one child process per rank, each told its place in
// the job through RANK, WORLD_SIZE, LOCAL_RANK (its CUDA device),
// LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, its output prefixed with
// its rank, and the whole group stopped when one rank fails.
package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configures Run.
type Options struct {
	// NProc is the number of ranks to start (at least 1).
	NProc int
	// Program and Args are the command of every rank.
	Program string
	Args    []string
	// Env is the environment the ranks start from (default os.Environ());
	// the launch variables are replaced.
	Env []string
	// MasterAddr and MasterPort are where rank 0's rendezvous listens;
	// defaults 127.0.0.1 and a free port.
	MasterAddr string
	MasterPort int
	// Stdout and Stderr receive the ranks' output, each line prefixed
	// with "[rank N] " (default os.Stdout, os.Stderr).
	Stdout, Stderr io.Writer
	// Grace is how long a rank may take to stop after SIGINT (when ctx is
	// done) or SIGTERM (when another rank failed) before it is killed;
	// default 30s.
	Grace time.Duration
}

// launchVars are the variables Run sets for each rank.
var launchVars = []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}

// RankError is a rank that exited unsuccessfully.
type RankError struct {
	Rank int
	Err  error // from exec: an *exec.ExitError, or why it did not start
}

func (e *RankError) Error() string { return fmt.Sprintf("rank %d: %v", e.Rank, e.Err) }
func (e *RankError) Unwrap() error { return e.Err }

// Run starts the ranks and waits for all of them. When one fails, the
// others get SIGTERM (then SIGKILL after Grace) and Run returns the first
// failure, a *RankError. When ctx is done, every rank gets SIGINT (then
// SIGKILL after Grace) and Run returns ctx.Err() once they have exited.
func Run(ctx context.Context, o Options) error {
	if o.NProc < 1 {
		return fmt.Errorf("launch: %d processes: want at least 1", o.NProc)
	}
	if o.Env == nil {
		o.Env = os.Environ()
	}
	if o.MasterAddr == "" {
		o.MasterAddr = "127.0.0.1"
	}
	if o.MasterPort == 0 {
		p, err := freePort(o.MasterAddr)
		if err != nil {
			return fmt.Errorf("launch: choosing MASTER_PORT: %w", err)
		}
		o.MasterPort = p
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Grace <= 0 {
		o.Grace = 30 * time.Second
	}
	out, errOut := &lineWriter{w: o.Stdout}, &lineWriter{w: o.Stderr}

	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, o.NProc)
	cmds := make([]*exec.Cmd, o.NProc)
	var copies sync.WaitGroup
	for r := range o.NProc {
		cmd := exec.Command(o.Program, o.Args...)
		cmd.Env = rankEnv(o, r)
		stdout, err1 := cmd.StdoutPipe()
		stderr, err2 := cmd.StderrPipe()
		if err := errors.Join(err1, err2); err != nil {
			exits <- exit{r, err}
			break
		}
		if err := cmd.Start(); err != nil {
			exits <- exit{r, fmt.Errorf("starting %s: %w", o.Program, err)}
			break
		}
		cmds[r] = cmd
		prefix := fmt.Sprintf("[rank %d] ", r)
		var pipes sync.WaitGroup
		for _, p := range []struct {
			r io.Reader
			w *lineWriter
		}{{stdout, out}, {stderr, errOut}} {
			pipes.Go(func() { p.w.copyLines(prefix, p.r) })
		}
		copies.Go(func() {
			pipes.Wait() // Wait closes the pipes: read them to the end first
			exits <- exit{r, cmd.Wait()}
		})
	}

	var first error
	stopping := false
	exited := make([]bool, o.NProc)
	stopAll := func(sig os.Signal) {
		stopping = true
		for r, c := range cmds {
			if c != nil && !exited[r] {
				_ = c.Process.Signal(sig)
			}
		}
	}
	var kill <-chan time.Time
	done := ctx.Done()
	for running := countStarted(cmds); running > 0; {
		select {
		case e := <-exits:
			if cmds[e.rank] != nil {
				exited[e.rank] = true
				running--
			}
			if e.err == nil {
				continue
			}
			if first == nil && ctx.Err() == nil {
				first = &RankError{Rank: e.rank, Err: e.err}
				fmt.Fprintf(errOut, "spill: rank %d failed (%v); stopping the other ranks\n", e.rank, e.err)
			}
			if !stopping {
				stopAll(syscall.SIGTERM)
				kill = time.After(o.Grace)
			}
		case <-done:
			done = nil
			if !stopping {
				stopAll(os.Interrupt)
				kill = time.After(o.Grace)
			}
		case <-kill:
			kill = nil
			for r, c := range cmds {
				if c != nil && !exited[r] {
					fmt.Fprintf(errOut, "spill: rank %d did not stop within %v; killing it\n", r, o.Grace)
					_ = c.Process.Kill()
				}
			}
		}
	}
	copies.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	// A start failure leaves fewer started ranks than exits to read.
	for {
		select {
		case e := <-exits:
			if first == nil && e.err != nil {
				first = &RankError{Rank: e.rank, Err: e.err}
			}
		default:
			return first
		}
	}
}

func countStarted(cmds []*exec.Cmd) int {
	n := 0
	for _, c := range cmds {
		if c != nil {
			n++
		}
	}
	return n
}

// rankEnv is o.Env with the launch variables of rank r.
func rankEnv(o Options, r int) []string {
	env := make([]string, 0, len(o.Env)+len(launchVars))
	for _, kv := range o.Env {
		k, _, _ := strings.Cut(kv, "=")
		if !isLaunchVar(k) {
			env = append(env, kv)
		}
	}
	return append(env,
		"RANK="+strconv.Itoa(r),
		"WORLD_SIZE="+strconv.Itoa(o.NProc),
		"LOCAL_RANK="+strconv.Itoa(r),
		"LOCAL_WORLD_SIZE="+strconv.Itoa(o.NProc),
		"MASTER_ADDR="+o.MasterAddr,
		"MASTER_PORT="+strconv.Itoa(o.MasterPort))
}

func isLaunchVar(k string) bool {
	for _, v := range launchVars {
		if k == v {
			return true
		}
	}
	return false
}

// freePort asks the system for a TCP port free on addr. Rank 0 listens on
// it a moment later; another program taking it meanwhile is unlikely.
func freePort(addr string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// lineWriter writes whole lines to w, one at a time, so that the lines of
// several ranks do not interleave.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// copyLines copies r to l line by line, each prefixed.
func (l *lineWriter) copyLines(prefix string, r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			if !strings.HasSuffix(line, "\n") {
				line += "\n"
			}
			_, _ = l.Write([]byte(prefix + line))
		}
		if err != nil {
			return
		}
	}
}
