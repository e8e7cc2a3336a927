package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestHelperProcess is the rank the tests launch (the os/exec test helper
// pattern): it does what LAUNCH_HELPER says and exits.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv("LAUNCH_HELPER")
	if mode == "" {
		return
	}
	rank := os.Getenv("RANK")
	fmt.Printf("env RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s\n", rank,
		os.Getenv("WORLD_SIZE"), os.Getenv("LOCAL_RANK"), os.Getenv("LOCAL_WORLD_SIZE"), os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	fmt.Fprintf(os.Stderr, "to stderr\nno newline")
	switch {
	case mode == "ok":
		os.Exit(0)
	case mode == "fail1" && rank == "1":
		time.Sleep(500 * time.Millisecond) // the others are waiting for signals by then
		os.Exit(3)
	case mode == "fail1", mode == "wait":
		// Wait for a signal, as a training rank would, and report it.
		c := make(chan os.Signal, 1)
		signal.Notify(c, os.Interrupt, syscall.SIGTERM)
		select {
		case s := <-c:
			fmt.Printf("got %v\n", s)
			os.Exit(130)
		case <-time.After(time.Minute):
			os.Exit(9)
		}
	case mode == "stubborn":
		signal.Ignore(os.Interrupt, syscall.SIGTERM)
		fmt.Println("ignoring signals")
		time.Sleep(time.Minute)
	}
	os.Exit(0)
}

// syncBuffer is a bytes.Buffer safe for the launcher's writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func launch(ctx context.Context, t *testing.T, mode string, n int, grace time.Duration) (string, string, error) {
	t.Helper()
	var out, errOut syncBuffer
	err := Run(ctx, Options{
		NProc:   n,
		Program: os.Args[0],
		Args:    []string{"-test.run=^TestHelperProcess$"},
		Env:     append(os.Environ(), "LAUNCH_HELPER="+mode, "RANK=99", "WORLD_SIZE=99"),
		Stdout:  &out, Stderr: &errOut, Grace: grace,
	})
	return out.String(), errOut.String(), err
}

func TestRunSetsRankEnvironment(t *testing.T) {
	out, errOut, err := launch(context.Background(), t, "ok", 3, 0)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	var port string
	for r := range 3 {
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, fmt.Sprintf("[rank %d] env ", r)) {
				line = l
			}
		}
		want := fmt.Sprintf("[rank %d] env RANK=%d WORLD_SIZE=3 LOCAL_RANK=%d LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=", r, r, r)
		if !strings.HasPrefix(line, want) {
			t.Fatalf("rank %d printed %q, want %q...\nall output:\n%s", r, line, want, out)
		}
		p := strings.TrimPrefix(line, want)
		if p == "" || port != "" && p != port {
			t.Fatalf("MASTER_PORT %q (rank 0 had %q)", p, port)
		}
		port = p
		for _, w := range []string{fmt.Sprintf("[rank %d] to stderr\n", r), fmt.Sprintf("[rank %d] no newline\n", r)} {
			if !strings.Contains(errOut, w) {
				t.Fatalf("stderr lacks %q:\n%s", w, errOut)
			}
		}
	}
}

func TestRunFailingRankStopsTheOthers(t *testing.T) {
	start := time.Now()
	out, errOut, err := launch(context.Background(), t, "fail1", 3, 10*time.Second)
	var re *RankError
	var ee *exec.ExitError
	if !errors.As(err, &re) || re.Rank != 1 || !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("error %v, want rank 1's exit status 3", err)
	}
	if !strings.Contains(errOut, "rank 1 failed") {
		t.Errorf("stderr does not say which rank failed:\n%s", errOut)
	}
	for _, r := range []int{0, 2} {
		if !strings.Contains(out, fmt.Sprintf("[rank %d] got terminated", r)) {
			t.Errorf("rank %d was not sent SIGTERM:\n%s", r, out)
		}
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestRunForwardsInterrupt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel)
	out, errOut, err := launch(ctx, t, "wait", 2, 10*time.Second)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want context.Canceled\n%s", err, errOut)
	}
	for r := range 2 {
		if !strings.Contains(out, fmt.Sprintf("[rank %d] got interrupt", r)) {
			t.Errorf("rank %d did not get SIGINT:\n%s", r, out)
		}
	}
}

func TestRunKillsAfterGrace(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel)
	start := time.Now()
	_, errOut, err := launch(ctx, t, "stubborn", 2, 300*time.Millisecond)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want context.Canceled", err)
	}
	if !strings.Contains(errOut, "did not stop within 300ms; killing it") {
		t.Errorf("stderr:\n%s", errOut)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestRunBadProgram(t *testing.T) {
	err := Run(context.Background(), Options{NProc: 2, Program: "/nonexistent/spill", Stdout: &syncBuffer{}, Stderr: &syncBuffer{}})
	var re *RankError
	if !errors.As(err, &re) || re.Rank != 0 || !strings.Contains(err.Error(), "starting /nonexistent/spill") {
		t.Fatalf("%v", err)
	}
	if err := Run(context.Background(), Options{NProc: 0}); err == nil {
		t.Fatal("NProc 0 accepted")
	}
}
