package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spill-ml/spill/cmd/spill/internal/launch"
)

const nprocUsage = "start `N` processes of spill train on this host, one per GPU, the way torchrun does " +
	"(RANK, WORLD_SIZE, LOCAL_RANK = CUDA device, MASTER_ADDR, MASTER_PORT; output prefixed with the rank; " +
	"one failing stops all). The ranks train data parallel over NCCL (--device cuda; the global batch is " +
	"N x batch x accum, each rank reading its own share); the cpu device trains one process only"

// launchTrain runs spill train with args, less --nproc-per-node, as n
// local ranks (internal/launch) and waits for them.
func launchTrain(ctx context.Context, n int, args []string, stdout, stderr io.Writer) error {
	if n < 1 {
		return usagef("--nproc-per-node %d: want at least 1", n)
	}
	if ws := os.Getenv("WORLD_SIZE"); ws != "" {
		return usagef("--nproc-per-node in a process launched as a rank (WORLD_SIZE=%s): give it to the outer spill train only", ws)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--nproc-per-node: finding this program to start it again: %w", err)
	}
	err = launch.Run(ctx, launch.Options{
		NProc:   n,
		Program: exe,
		Args:    append([]string{"train"}, withoutFlag(args, "nproc-per-node")...),
		Stdout:  stdout,
		Stderr:  stderr,
	})
	var re *launch.RankError
	if errors.As(err, &re) {
		// The rank printed why; exit with a failure, saying nothing more.
		fmt.Fprintf(stderr, "spill: %v\n", err)
		return &silentError{code: exitFailure}
	}
	return err
}

// withoutFlag returns args less every --name (or -name) with its value,
// given as --name=V or --name V, up to a "--".
func withoutFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		f := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if !strings.HasPrefix(a, "-") {
			out = append(out, a)
			continue
		}
		if f == name {
			i++ // the value
			continue
		}
		if strings.HasPrefix(f, name+"=") {
			continue
		}
		out = append(out, a)
	}
	return out
}
